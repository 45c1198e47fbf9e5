package model

// Epoch counts a campaign's loads into Redis (0: never loaded). Every load
// (preload, rebuild, change before the start) moves it on in MySQL first,
// and an order is stored only under the epoch MySQL is at: a decision made
// against a Redis that was rebuilt since is refused (ErrLedgerMoved) and
// made again.
type Epoch int64

// EpochMixed stands for results decided under more than one load (two
// buckets of a campaign, or requests given up one by one, on both sides of
// a load). MySQL never has it, so their orders are refused and the batch is
// decided again, all under one epoch.
const EpochMixed Epoch = -1

// Epochs names, per campaign, the epoch a batch's results were decided
// under.
type Epochs map[string]Epoch

// Add records that results of the campaign were decided under e.
func (es Epochs) Add(campaignID string, e Epoch) {
	if was, ok := es[campaignID]; ok && was != e {
		e = EpochMixed
	}
	es[campaignID] = e
}
