package main

import "testing"

// TestGCPercent: only the gateway role alone gets its GC target, and an
// operator's GOGC (even an empty one, which Go reads as the default) wins.
func TestGCPercent(t *testing.T) {
	tests := []struct {
		name    string
		roles   roleSet
		env     map[string]string
		want    int
		wantSet bool
	}{
		{"gateway", roleSet{gateway: true}, nil, busyGCPercent, true},
		{"gateway with GOGC", roleSet{gateway: true}, map[string]string{"GOGC": "100"}, 0, false},
		{"gateway with empty GOGC", roleSet{gateway: true}, map[string]string{"GOGC": ""}, 0, false},
		{"worker", roleSet{worker: true}, nil, busyGCPercent, true},
		{"gateway and worker", roleSet{gateway: true, worker: true}, nil, busyGCPercent, true},
		{"serve", roleSet{gateway: true, worker: true, notifier: true}, nil, 0, false},
		{"notifier", roleSet{notifier: true}, nil, 0, false},
		{"serve with GOMEMLIMIT", roleSet{gateway: true, worker: true, notifier: true}, map[string]string{"GOMEMLIMIT": "2GiB"}, busyGCPercent, true},
		{"notifier with GOMEMLIMIT and GOGC", roleSet{notifier: true}, map[string]string{"GOMEMLIMIT": "2GiB", "GOGC": "200"}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, set := gcPercent(tc.roles, tc.env)
			if got != tc.want || set != tc.wantSet {
				t.Errorf("got %d, %v; want %d, %v", got, set, tc.want, tc.wantSet)
			}
		})
	}
}
