package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/webhook"
)

// The Standard Webhooks specification's published example, which its reference libraries
// test against: a receiver's library accepts our signatures only if we reproduce it.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specBody      = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func mustSecret(t *testing.T, s string) webhook.Secret {
	t.Helper()
	secret, err := webhook.ParseSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// TestSignSpecVector: Sign reproduces the specification's example exactly.
func TestSignSpecVector(t *testing.T) {
	t.Parallel()
	got := webhook.Sign(mustSecret(t, specSecret), specID, time.Unix(specTimestamp, 0), []byte(specBody))
	if got != specSignature {
		t.Errorf("Sign(spec example) = %q, want %q", got, specSignature)
	}
}

// TestSignIndependent: Sign agrees with HMAC-SHA256 computed apart, over "<id>.<ts>.<body>"
// keyed with the secret's decoded bytes: by hand with crypto/hmac, and by openssl when the
// machine has it.
func TestSignIndependent(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret.Text(), "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 300)
	rand.Read(body)
	id, at := "evt_42", time.Unix(1700000000, 999)
	signed := []byte(id + "." + strconv.FormatInt(at.Unix(), 10) + "." + string(body))
	got := webhook.Sign(secret, id, at, body)

	h := hmac.New(sha256.New, key)
	h.Write(signed)
	if want := "v1," + base64.StdEncoding.EncodeToString(h.Sum(nil)); got != want {
		t.Errorf("Sign = %q, crypto/hmac by hand = %q", got, want)
	}
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Log("no openssl: checked against crypto/hmac only")
		return
	}
	cmd := exec.Command(openssl, "dgst", "-sha256", "-mac", "HMAC", "-macopt", "hexkey:"+hex.EncodeToString(key), "-binary")
	cmd.Stdin = bytes.NewReader(signed)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl: %v", err)
	}
	if want := "v1," + base64.StdEncoding.EncodeToString(out); got != want {
		t.Errorf("Sign = %q, openssl = %q", got, want)
	}
}

// TestVerify: a receiver accepts a fresh request signed with its secret, one valid signature
// among several, and refuses anything else, naming the header at fault.
func TestVerify(t *testing.T) {
	t.Parallel()
	secret := mustSecret(t, specSecret)
	other, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(specTimestamp, 0).Add(time.Minute)
	headers := func(id, ts string, sigs ...string) http.Header {
		h := http.Header{}
		for k, v := range map[string]string{webhook.HeaderID: id, webhook.HeaderTimestamp: ts, webhook.HeaderSignature: strings.Join(sigs, " ")} {
			if v != "" {
				h.Set(k, v)
			}
		}
		return h
	}
	ts := strconv.Itoa(specTimestamp)
	at := func(d time.Duration) (string, string) {
		tt := now.Add(d)
		return strconv.FormatInt(tt.Unix(), 10), webhook.Sign(secret, specID, tt, []byte(specBody))
	}
	old, oldSig := at(-6 * time.Minute)
	future, futureSig := at(6 * time.Minute)
	recent, recentSig := at(-4 * time.Minute)
	tests := []struct {
		name      string
		secret    webhook.Secret
		h         http.Header
		body      string
		wantField string // "" for accepted
	}{
		{"spec example", secret, headers(specID, ts, specSignature), specBody, ""},
		{"one of several signatures", secret, headers(specID, ts, "v1,bm9wZQ==", specSignature), specBody, ""},
		{"within tolerance", secret, headers(specID, recent, recentSig), specBody, ""},
		{"wrong secret", other, headers(specID, ts, specSignature), specBody, webhook.HeaderSignature},
		{"body changed", secret, headers(specID, ts, specSignature), `{"test": 2432232315}`, webhook.HeaderSignature},
		{"id changed", secret, headers("msg_other", ts, specSignature), specBody, webhook.HeaderSignature},
		{"timestamp changed", secret, headers(specID, strconv.Itoa(specTimestamp+1), specSignature), specBody, webhook.HeaderSignature},
		{"other version", secret, headers(specID, ts, "v1a,"+strings.TrimPrefix(specSignature, "v1,")), specBody, webhook.HeaderSignature},
		{"not base64", secret, headers(specID, ts, "v1,!!!"), specBody, webhook.HeaderSignature},
		{"no signature", secret, headers(specID, ts), specBody, webhook.HeaderSignature},
		{"no id", secret, headers("", ts, specSignature), specBody, webhook.HeaderID},
		{"no timestamp", secret, headers(specID, "", specSignature), specBody, webhook.HeaderTimestamp},
		{"timestamp not a number", secret, headers(specID, "yesterday", specSignature), specBody, webhook.HeaderTimestamp},
		{"too old", secret, headers(specID, old, oldSig), specBody, webhook.HeaderTimestamp},
		{"in the future", secret, headers(specID, future, futureSig), specBody, webhook.HeaderTimestamp},
		{"no secret", webhook.Secret{}, headers(specID, ts, specSignature), specBody, "secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := webhook.Verify(tt.secret, tt.h, []byte(tt.body), now, 0)
			if tt.wantField == "" {
				if err != nil {
					t.Errorf("Verify = %v, want nil", err)
				}
				return
			}
			if got := fieldOf(err); got != tt.wantField || !errors.Is(err, webhook.ErrUnverified) {
				t.Errorf("Verify = %v (field %q), want an ErrUnverified naming %q", err, got, tt.wantField)
			}
		})
	}
}

// TestParseSecret: whsec_ and standard base64 of 24 to 64 bytes; anything else is an error
// naming "secret" that does not repeat it.
func TestParseSecret(t *testing.T) {
	t.Parallel()
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, n)) }
	tests := []struct {
		name, in string
		wantErr  string // a substring of the error; "" for none
	}{
		{"spec example", specSecret, ""},
		{"64 bytes", "whsec_" + b64(64), ""},
		{"no prefix", strings.TrimPrefix(specSecret, "whsec_"), `must start with "whsec_"`},
		{"other prefix", "wh_" + b64(24), `must start with "whsec_"`},
		{"empty", "", `must start with "whsec_"`},
		{"not base64", "whsec_not*base64*at*all*", "base64"},
		{"url base64", "whsec_" + strings.ReplaceAll(strings.ReplaceAll(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb, 0xff}, 12)), "+", "-"), "/", "_"), "base64"},
		{"23 bytes", "whsec_" + b64(23), "24 to 64 bytes, got 23"},
		{"65 bytes", "whsec_" + b64(65), "24 to 64 bytes, got 65"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := webhook.ParseSecret(tt.in)
			if tt.wantErr == "" {
				if err != nil || s.Text() != tt.in {
					t.Errorf("ParseSecret(%q) = %q, %v; want it back, nil", tt.in, s.Text(), err)
				}
				return
			}
			if err == nil || fieldOf(err) != "secret" || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseSecret(%q) error = %v, want one naming secret, saying %q", tt.in, err, tt.wantErr)
			}
			if body := strings.TrimPrefix(tt.in, "whsec_"); len(body) > 8 && strings.Contains(err.Error(), body) {
				t.Errorf("ParseSecret error %q repeats the secret", err)
			}
		})
	}
}

// TestSecretForms: NewSecret makes distinct secrets of 24 bytes that Text and JSON carry
// whole, and that String (hence logs) does not show.
func TestSecretForms(t *testing.T) {
	t.Parallel()
	a, errA := webhook.NewSecret()
	b, errB := webhook.NewSecret()
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a.Text() == b.Text() {
		t.Errorf("two NewSecret are both %q", a.Text())
	}
	if key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(a.Text(), "whsec_")); len(key) != webhook.MinSecretBytes {
		t.Errorf("NewSecret has %d bytes, want %d", len(key), webhook.MinSecretBytes)
	}
	if s := a.String(); strings.Contains(s, strings.TrimPrefix(a.Text(), "whsec_")) {
		t.Errorf("String() = %q shows the key", s)
	}
	ep := webhook.Endpoint{ID: "e", URL: "https://93.184.215.14/", Secret: a}
	data, err := json.Marshal(ep)
	if err != nil {
		t.Fatal(err)
	}
	var back webhook.Endpoint
	if err := json.Unmarshal(data, &back); err != nil || back.Secret.Text() != a.Text() {
		t.Errorf("JSON round trip of %s = %q, %v; want the secret back", data, back.Secret.Text(), err)
	}
	if err := json.Unmarshal([]byte(`{"secret":"whsec_short"}`), &back); fieldOf(err) != "secret" {
		t.Errorf("JSON with a bad secret: %v, want an error naming secret", err)
	}
}
