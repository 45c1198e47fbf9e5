package model

import "time"

// Challenge is a puzzle a shopper solves before buying from a campaign
// whose ChallengeBits is above 0.
type Challenge struct {
	Token     string
	Bits      int
	ExpiresAt time.Time
}

// ChallengePass is a verified solution: ID names its challenge, which may
// buy once until ExpiresAt.
type ChallengePass struct {
	ID        string
	ExpiresAt time.Time
}
