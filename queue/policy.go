package queue

import (
	"errors"
	"log/slog"
	"time"
)

// The consumer policy: what becomes of a batch once a handler (or a
// Finish) returned, how that moves its messages' Attempt, how long the
// redelivery waits and what is logged. Every driver applies it; what stays
// in a driver is how it keeps a batch for redelivery (memqueue's lists,
// redisstream's pending entries, RocketMQ's library), so a fix to delivery
// semantics is made here once.

// Outcome is what becomes of a batch after a step of its handler.
type Outcome int

const (
	// Ack: the step succeeded. After a handler or a Finish the batch is
	// acknowledged (once the batches ahead of it are); after a
	// PipelineHandler's first step its Finish runs.
	Ack Outcome = iota
	// Redeliver: the step failed. The batch comes back, each message with
	// its Attempt one higher.
	Redeliver
	// Hold: the step returned an error wrapping ErrHeld. The batch comes
	// back, each message with the Attempt it had.
	Hold
)

func (o Outcome) String() string {
	switch o {
	case Ack:
		return "ack"
	case Redeliver:
		return "redeliver"
	case Hold:
		return "hold"
	}
	return "unknown"
}

// Classify is the one reading of a step's result that every driver uses.
func Classify(err error) Outcome {
	switch {
	case err == nil:
		return Ack
	case errors.Is(err, ErrHeld):
		return Hold
	}
	return Redeliver
}

// Counts reports whether a delivery that ended in o counts towards its
// messages' Attempt: every one does (a consumer's crash too, since nothing
// said otherwise) except a hold.
func (o Outcome) Counts() bool { return o != Hold }

// maxBackoffSteps caps the redelivery back-off at base << maxBackoffSteps.
const maxBackoffSteps = 6

// Backoff is the wait before a batch is handed out again after failures
// unacknowledged steps in a row (failed or held, this one included): base,
// doubling with each, at most 64 times base.
func Backoff(base time.Duration, failures int) time.Duration {
	return base << min(max(failures-1, 0), maxBackoffSteps)
}

// Settle classifies err, the result of a step on msgs, and logs a batch
// that is not acknowledged: one line with its message count, its first
// message's attempt and the error, plus attrs. A failure is logged at WARN.
// A hold is expected (the consumer waits it out), so it is logged at INFO
// when it starts (failures is 1: the first unacknowledged step in a row)
// and at DEBUG while it lasts.
func Settle(log *slog.Logger, msgs []Message, err error, failures int, attrs ...any) Outcome {
	o := Classify(err)
	if o == Ack {
		return o
	}
	attempt := 0
	if len(msgs) > 0 {
		attempt = msgs[0].Attempt
	}
	attrs = append(attrs, "messages", len(msgs), "attempt", attempt, "err", err)
	switch {
	case o == Redeliver:
		log.Warn("batch failed; it will be redelivered", attrs...)
	case failures <= 1:
		log.Info("batch held; it will be redelivered until the hold ends", attrs...)
	default:
		log.Debug("batch still held", append(attrs, "in_a_row", failures)...)
	}
	return o
}
