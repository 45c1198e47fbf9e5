package model

import (
	"errors"
	"fmt"
	"testing"
)

func TestEpochsAdd(t *testing.T) {
	tests := []struct {
		name string
		adds []Epoch
		want Epoch
	}{
		{name: "one", adds: []Epoch{3}, want: 3},
		{name: "the same twice", adds: []Epoch{3, 3}, want: 3},
		{name: "two loads", adds: []Epoch{3, 4}, want: EpochMixed},
		{name: "mixed stays mixed", adds: []Epoch{3, 4, 3}, want: EpochMixed},
		{name: "never loaded", adds: []Epoch{0, 0}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			es := Epochs{}
			for _, e := range tc.adds {
				es.Add("c", e)
			}
			if got := es["c"]; got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
			if _, ok := es["other"]; ok {
				t.Errorf("another campaign got an epoch")
			}
		})
	}
}

func TestHolds(t *testing.T) {
	for _, err := range []error{ErrNotLoaded, ErrPaused, ErrUnavailable, ErrLedgerMoved} {
		wrapped := fmt.Errorf("deduct: %w", err)
		if !errors.Is(wrapped, ErrHeld) || !errors.Is(wrapped, err) {
			t.Errorf("%v: got errors.Is(ErrHeld) %v, want true and still itself", err, errors.Is(wrapped, ErrHeld))
		}
		if errors.Is(wrapped, ErrSoldOut) {
			t.Errorf("%v is ErrSoldOut", err)
		}
	}
	for _, err := range []error{ErrSoldOut, ErrNotFound, ErrMaybeNotEnqueued, ErrRateLimited, errors.New("connection refused")} {
		if errors.Is(err, ErrHeld) {
			t.Errorf("%v: is ErrHeld, want not", err)
		}
	}
}
