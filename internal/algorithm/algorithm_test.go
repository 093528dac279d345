package algorithm

import "testing"

// TestInvalid: an ID outside the table names no algorithm, whatever is asked of it, and
// panics at nothing.
func TestInvalid(t *testing.T) {
	t.Parallel()
	for _, a := range []ID{0, Balance + 1, 255} {
		if a.Valid() || a.Derived() || a.Holds() || a.HasBurst() || a.Remote() || a.Module() != "" || a.Code() != "invalid" {
			t.Errorf("ID %d: valid %v, derived %v, holds %v, burst %v, module %q, code %q; want none",
				a, a.Valid(), a.Derived(), a.Holds(), a.HasBurst(), a.Module(), a.Code())
		}
	}
	if _, err := Parse("calendar_window"); err == nil {
		t.Error("Parse of a derived algorithm's module: want an error")
	}
	if _, err := Parse("balance"); err == nil || !Balance.Remote() || !Balance.Derived() {
		t.Error("balance: want a derived, remote algorithm that rules files cannot name")
	}
	if a, err := Parse("gcra"); err != nil || a != GCRA {
		t.Errorf("Parse(gcra) = %v, %v; want GCRA", a, err)
	}
}
