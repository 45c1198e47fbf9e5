package model

import "time"

// PreloadOutcome says what loading a campaign's stock did.
type PreloadOutcome string

// Preload outcomes.
const (
	PreloadLoaded    PreloadOutcome = "loaded"
	PreloadUnchanged PreloadOutcome = "unchanged"
	// PreloadRebuilt: Redis had lost the campaign (or held an older
	// epoch of it); it was rebuilt from the orders in MySQL.
	PreloadRebuilt PreloadOutcome = "rebuilt"
)

// Deduction is one request of a batch the worker decides.
type Deduction struct {
	RequestID string
	UserID    string
	Quantity  int64
	// OrderID is used if the request succeeds now; a request that already
	// succeeded keeps its stored order id.
	OrderID string
}

// DeductReply is the outcome of deciding a batch of Deductions.
type DeductReply struct {
	Results []Result // one per Deduction, same order
	// SoldOutNow is true when this batch took the stock to zero.
	SoldOutNow bool
	// Epoch is the campaign's epoch in Redis the batch was decided under;
	// its orders are stored only while MySQL is at the same one.
	Epoch Epoch
	// Made is the highest decision number of the batch's successes, 0 when
	// none has one. A shopper sees them once the tag's durable mark is
	// raised to it, after their orders are stored.
	Made int64
}

// Projection is what Redis holds of a campaign's definition: the values
// and the epoch it was last loaded with.
type Projection struct {
	Loaded         bool
	Epoch          Epoch
	Stock          int64
	Limit          int64
	StartAt, EndAt time.Time
	Paused         bool
}

// Stats is a campaign's live counters (in Redis).
type Stats struct {
	Loaded           bool
	Stock            int64
	Remaining        int64
	Sold             int64
	SoldOut          bool
	Admitted         int64
	FinishedByStatus map[Status]int64
	// Lost counts the requests given rejected (lost) because Redis lost
	// their queued marker (lost.lua): never counted admitted in this load,
	// so apart from Admitted and FinishedByStatus. A rebuild counts them
	// admitted and finished, as every result it keeps, and sets this to 0.
	Lost int64
}

// Queued is the number of admitted requests without a final result yet.
func (st Stats) Queued() int64 {
	q := st.Admitted
	for _, n := range st.FinishedByStatus {
		q -= n
	}
	return max(q, 0)
}

// OrderStats counts a campaign's stored orders and their units.
type OrderStats struct {
	Orders int64
	Units  int64
}

// Snapshot is everything Redis holds about a campaign's sales, for
// reconciliation with the order table.
type Snapshot struct {
	Loaded    bool
	Epoch     Epoch
	Stock     int64
	Limit     int64
	Remaining int64
	Sold      int64
	SoldOut   bool
	// Units is the per-user units counter.
	Units map[string]int64
	// Successes are the stored success results by request id.
	Successes map[string]Result
	// Queued counts results not final yet (a settled campaign has none).
	Queued int64
	// Admitted is the admitted counter (Remove checks it has not moved).
	Admitted int64
	// Lost are the requests that ended rejected (ReasonLost): their state
	// died with Redis and the queue had passed them.
	Lost []string
}
