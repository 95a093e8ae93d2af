package gguf

import (
	"reflect"
	"testing"
)

func TestSplitRows(t *testing.T) {
	for _, tc := range []struct {
		rows, per int64
		want      []Unit
	}{
		{10, 4, []Unit{{2, 0, 4}, {2, 4, 8}, {2, 8, 10}}},
		{8, 4, []Unit{{2, 0, 4}, {2, 4, 8}}},
		{3, 0, []Unit{{2, 0, 1}, {2, 1, 2}, {2, 2, 3}}}, // per below 1: a row at a time
		{0, 4, []Unit{{2, 0, 0}}},                       // an empty tensor still has its unit
	} {
		got := SplitRows([]Unit{{1, 0, 5}}, 2, tc.rows, tc.per)
		if !reflect.DeepEqual(got[1:], tc.want) || got[0] != (Unit{1, 0, 5}) {
			t.Errorf("SplitRows(%d rows, %d per) = %v, want %v after the unit given", tc.rows, tc.per, got, tc.want)
		}
	}
}
