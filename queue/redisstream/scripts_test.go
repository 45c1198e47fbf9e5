package redisstream

import "testing"

// TestScriptNames names every script by the hash go-redis calls it by.
func TestScriptNames(t *testing.T) {
	lease, delays := newLeaseScripts(), newDelayScripts()
	names := ScriptNames()
	for want, script := range map[string]interface{ Hash() string }{
		"lease_acquire": lease.acquire, "lease_renew": lease.renew, "lease_release": lease.release,
		"delay_add": delays.add, "delay_move": delays.move,
	} {
		if got := names[script.Hash()]; got != want {
			t.Errorf("script %s: got name %q", want, got)
		}
	}
}
