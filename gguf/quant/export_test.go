package quant

import "testing"

// Register puts r into the type table for the rest of tb, as a row in rows
// would be, and fails tb unless checkRow finds it whole. It is how a test
// outside the package adds a type of its own; tb must not run in parallel
// with tests that read the table.
func Register(tb testing.TB, r Traits) {
	tb.Helper()
	if r.Type >= typeCodes || table[r.Type].Name != "" {
		tb.Fatalf("Register %s: code %d is taken or out of range", r.Name, r.Type)
	}
	if t, ok := ParseType(r.Name); ok {
		tb.Fatalf("Register %s: the name is %s's", r.Name, t)
	}
	table[r.Type] = r
	tb.Cleanup(func() { table[r.Type] = Traits{} })
	if err := checkRow(r); err != nil {
		tb.Fatal(err)
	}
}
