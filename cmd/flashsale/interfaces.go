package main

import (
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/challenge"
	"github.com/flashsale/flashsale/internal/lifecycle"
	"github.com/flashsale/flashsale/internal/reconcile"
	"github.com/flashsale/flashsale/internal/sqlstore"
	"github.com/flashsale/flashsale/internal/store"
	"github.com/flashsale/flashsale/notifier"
	"github.com/flashsale/flashsale/worker"
)

// The drivers wired in satisfy the interfaces of the code that uses them.
// The checks live here, where both sides are imported: store and sqlstore
// must not import the roles.
var (
	_ gateway.Stock         = (*store.Store)(nil)
	_ gateway.Campaigns     = (*sqlstore.DB)(nil)
	_ gateway.Gate          = (*challenge.PoW)(nil)
	_ gateway.Orders        = (*lifecycle.Service)(nil)
	_ gateway.Restorer      = (*reconcile.Restorer)(nil)
	_ gateway.Decider       = (*sqlstore.DB)(nil)
	_ lifecycle.DB          = (*sqlstore.DB)(nil)
	_ lifecycle.Stock       = (*store.Store)(nil)
	_ worker.Stock          = (*store.Store)(nil)
	_ worker.Orders         = (*sqlstore.DB)(nil)
	_ worker.Lifecycle      = (*lifecycle.Service)(nil)
	_ worker.Restorer       = (*reconcile.Restorer)(nil)
	_ worker.Decider        = (*sqlstore.DB)(nil)
	_ notifier.Restorer     = (*reconcile.Restorer)(nil)
	_ notifier.ResultSource = (*store.Store)(nil)
	_ notifier.Ledger       = (*sqlstore.DB)(nil)
	_ notifier.LostRequests = (*store.Store)(nil)
	_ reconcile.Redis       = (*store.Store)(nil)
	_ reconcile.Orders      = (*sqlstore.DB)(nil)
	_ reconcile.Restoring   = (*store.Store)(nil)
)
