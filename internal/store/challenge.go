package store

import (
	"strconv"
	"time"
)

// A challenge of the bot gate admits one request: admit.lua records the
// holder of the request it admitted, "k" followed by the purchase's
// Idempotency-Key ("k" alone for none), so a repeat of the same keyed
// purchase passes it and gets its request back, while any other purchase
// is refused. Spending it in the batch's script call instead of a round
// trip of its own keeps the gate's cost low (docs/BENCHMARKS.md, issue 17).

// challengeKey is the key of challenge id of campaignID: the campaign's
// hash tag puts it in the slot of the admit call's other keys.
func challengeKey(campaignID, id string) string {
	return "fs:{" + campaignID + "}:challenge:" + id
}

// challengeHolder is the value a challenge's key holds once it admitted a
// purchase with idempotencyKey.
func challengeHolder(idempotencyKey string) string {
	return "k" + idempotencyKey
}

// challengeExpiry is the Unix second at which a challenge's key expires:
// expiresAt rounded up (a challenge outlives no part of its last second)
// and at least 1, which EXAT requires.
func challengeExpiry(expiresAt time.Time) string {
	sec := expiresAt.Unix()
	if expiresAt.Nanosecond() > 0 {
		sec++
	}
	return strconv.FormatInt(max(sec, 1), 10)
}
