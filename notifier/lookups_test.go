package notifier

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestLookupsBatch: frames that arrive while the round trips are under way
// go together in the next one, and each gets its own results, in order; a
// failed round trip fails every frame it carried.
func TestLookupsBatch(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			t.Parallel()
			e, f := fakeEnv(t)
			entered, release := make(chan string, 64), make(chan struct{})
			f.setAfterRead(func(id string) {
				entered <- id
				<-release
			})
			l := newLookups(t.Context(), f)
			const frames = 12
			ids := make([][]string, frames)
			for i := range ids {
				ids[i] = []string{e.newRequest(t, fmt.Sprint("u", i)), e.newRequest(t, fmt.Sprint("u", i))}
			}
			if fail {
				f.setFail(errors.New("redis down"))
			}
			type answer struct {
				i   int
				err error
				ok  bool
			}
			answers := make(chan answer, frames)
			var wg sync.WaitGroup
			read := func(i int) {
				wg.Go(func() {
					got, err := l.results(ids[i])
					ok := err == nil && len(got) == len(ids[i])
					for j := range got {
						ok = ok && got[j].RequestID == ids[i][j] && got[j].UserID == fmt.Sprint("u", i)
					}
					answers <- answer{i, err, ok}
				})
			}
			// Two frames take both flights and stop in the source, one
			// after the other (together, they could share one flight).
			read(0)
			<-entered
			read(1)
			<-entered
			for i := 2; i < frames; i++ {
				read(i)
			}
			testenv.Eventually(t, 5*time.Second, "the other frames to queue", func() (bool, string) {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.waiting) == frames-2, fmt.Sprintf("%d waiting", len(l.waiting))
			})
			before := f.trips.Load()
			close(release)
			wg.Wait()
			close(answers)
			for a := range answers {
				switch {
				case fail && a.err == nil:
					t.Errorf("frame %d: got no error, want the round trip's", a.i)
				case !fail && !a.ok:
					t.Errorf("frame %d: got %v, want its own results in order", a.i, a.err)
				}
			}
			if got := f.trips.Load() - before; got != 1 {
				t.Errorf("got %d round trips for the %d queued frames, want 1", got, frames-2)
			}
		})
	}
}
