package pipeline

import (
	"testing"
	"time"
)

// A waiter tells of a lease again only when its holder changes or a
// renewal moves its end, not when whole-second dates make the end it
// works out wander by a second.
func TestWaitSeenNews(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	seen := waitSeen{"mac", t0}
	for _, tc := range []struct {
		holder string
		until  time.Time
		want   bool
	}{
		{"mac", t0, false},
		{"mac", t0.Add(999 * time.Millisecond), false},
		{"mac", t0.Add(-time.Second), false},
		{"mac", t0.Add(40 * time.Second), true}, // renewed
		{"gpu", t0, true},                       // taken over
	} {
		if got := seen.news(tc.holder, tc.until); got != tc.want {
			t.Errorf("%s until %v: news %v, want %v", tc.holder, tc.until.Sub(t0), got, tc.want)
		}
	}
	if !(waitSeen{}).news("mac", t0) {
		t.Error("the first look is news")
	}
}
