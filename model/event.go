package model

// EventType names a campaign-level event.
type EventType string

// Campaign events.
const (
	// EventSoldOut: the campaign's stock reached zero.
	EventSoldOut EventType = "sold_out"
	// EventReset: the campaign was (re)loaded; cached flags must be dropped.
	EventReset EventType = "reset"
	// EventReturned: units came back on sale (an order expired, was
	// cancelled or refunded); cached sold-out flags must be dropped.
	EventReturned EventType = "returned"
	// EventChanged: the campaign was paused or resumed; cached copies of
	// it must be dropped.
	EventChanged EventType = "changed"
)

// Event is a campaign-level broadcast between instances.
type Event struct {
	Type       EventType
	CampaignID string
}
