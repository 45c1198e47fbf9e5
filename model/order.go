package model

import "time"

// Order is a successful purchase persisted in MySQL. RequestID is unique, so
// persisting the same success twice (after a redelivery) yields one row.
type Order struct {
	ID         string
	RequestID  string
	CampaignID string
	UserID     string
	Quantity   int64
	Status     OrderStatus
	CreatedAt  time.Time
}
