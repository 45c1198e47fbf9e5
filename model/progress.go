package model

import (
	"math"
	"time"
)

// QueueProgress is how far the workers have got through one campaign's
// line: every admitted request gets the next sequence number (Result.Seq),
// and the workers publish the highest one they decided. It is an estimate:
// a request refused or withdrawn after its admission keeps its number, and
// one admitted by another gateway may be decided out of turn.
type QueueProgress struct {
	// Decided is the highest sequence number a worker decided, 0 before any.
	Decided int64
	// Rate is the decisions per second over the last few seconds, 0 while
	// nothing has been measured.
	Rate float64
}

// maxETA bounds an estimate, so a rate near zero cannot overflow it.
const maxETA = 24 * time.Hour

// Ahead returns how many requests admitted before the one numbered seq are
// not decided yet, never below 0. It only goes down as Decided goes up.
func (p QueueProgress) Ahead(seq int64) int64 {
	return max(seq-p.Decided-1, 0)
}

// ETA estimates how long ahead requests take to be decided at the measured
// rate; 0 when there is no rate yet (nothing decided recently).
func (p QueueProgress) ETA(ahead int64) time.Duration {
	if ahead <= 0 || p.Rate <= 0 || math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) {
		return 0
	}
	secs := float64(ahead) / p.Rate
	if secs >= maxETA.Seconds() {
		return maxETA
	}
	return time.Duration(secs * float64(time.Second))
}
