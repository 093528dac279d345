package webhook

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzVerify: whatever a sender puts in the three headers and the body, Verify never panics,
// accepts what Sign signed with the receiver's secret, and accepts nothing else: a signature
// list is accepted only when it holds that one signature.
func FuzzVerify(f *testing.F) {
	secret, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1614265330, 0)
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,g0hM9SsE", []byte(`{"test": 2432232314}`))
	f.Add("", "", "", []byte(nil))
	f.Add("id", "-1", "v1,,v1 v2,x v1", []byte("{}"))
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sig)
		err := Verify(secret, h, body, now, time.Hour)
		unix, perr := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
		if err == nil {
			// Accepted: then the list must hold the signature Sign makes, at that timestamp.
			if perr != nil || !containsField(h.Get(HeaderSignature), Sign(secret, h.Get(HeaderID), time.Unix(unix, 0), body)) {
				t.Fatalf("Verify accepted id %q ts %q sig %q without the secret's signature", id, ts, sig)
			}
		}
		if perr != nil || h.Get(HeaderID) == "" || now.Sub(time.Unix(unix, 0)).Abs() > time.Hour {
			return
		}
		// Signed by Sign, beside whatever else the list held, it is accepted.
		h.Set(HeaderSignature, sig+" "+Sign(secret, h.Get(HeaderID), time.Unix(unix, 0), body))
		if err := Verify(secret, h, body, now, time.Hour); err != nil {
			t.Fatalf("Verify refused what Sign signed (id %q ts %q): %v", id, ts, err)
		}
	})
}

// containsField reports whether the list, split as Verify splits it, holds want.
func containsField(list, want string) bool { return slices.Contains(strings.Fields(list), want) }
