package notifier

import "testing"

func TestReleaseDue(t *testing.T) {
	tests := []struct {
		name                 string
		released, last, open int
		want                 bool
	}{
		{"a crowd arrived and holds still", 0, 10_000, 10_000, true},
		{"a crowd is still arriving", 0, 5_000, 10_000, false},
		{"the crowd left and it is quiet", 10_000, 0, 0, true},
		{"a few leave and come", 10_000, 10_050, 10_020, false},
		{"a small notifier's churn", 0, 300, 300, false},
		{"already released at this size", 15_000, 15_000, 15_000, false},
		{"a tenth left", 15_000, 13_400, 13_400, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := releaseDue(tc.released, tc.last, tc.open); got != tc.want {
				t.Errorf("releaseDue(%d, %d, %d) = %v, want %v", tc.released, tc.last, tc.open, got, tc.want)
			}
		})
	}
}
