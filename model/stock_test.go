package model

import "testing"

func TestStatsQueued(t *testing.T) {
	tests := []struct {
		name string
		st   Stats
		want int64
	}{
		{name: "nothing", st: Stats{}, want: 0},
		{name: "all queued", st: Stats{Admitted: 4}, want: 4},
		{name: "some finished", st: Stats{Admitted: 4, FinishedByStatus: map[Status]int64{StatusSuccess: 1, StatusRejected: 1}}, want: 2},
		// Requests decided without being admitted (a worker fed directly) never go negative.
		{name: "more finished than admitted", st: Stats{Admitted: 1, FinishedByStatus: map[Status]int64{StatusSoldOut: 3}}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.st.Queued(); got != tt.want {
				t.Errorf("Queued(): got %d, want %d", got, tt.want)
			}
		})
	}
}
