// Package lograte decides which occurrences of a repeated log line are
// logged: the first of each key (a peer, a client address) at once, then
// one per window while the key keeps repeating, saying how many went
// unlogged since the last. The log then says within a window that a
// condition lasts, without a line per occurrence: a raft leader retrying
// an unreachable peer every half second, a client sending plain HTTP to
// a TLS port in a loop.
package lograte

import (
	"sync"
	"time"
)

// Limiter remembers, for each key, when its line was last logged and how
// many occurrences were not since. It remembers at most max keys (New): beyond
// them, once none has been quiet for a window, the keys not remembered
// share one more entry (the zero K), so that a flood of new keys is
// limited too, as one. Safe for concurrent use.
type Limiter[K comparable] struct {
	window time.Duration
	max    int
	now    func() time.Time

	mu   sync.Mutex
	keys map[K]*entry
}

type entry struct {
	logged     time.Time // the last occurrence logged
	last       time.Time // the last occurrence, logged or not
	suppressed int       // occurrences since logged, not logged
}

// Verdict is what Note decides of one occurrence: log it or not, and if
// so how many were not logged since when (Suppressed 0: it is the first
// of its key, or the first after the key was quiet for a window).
type Verdict struct {
	Log        bool
	Suppressed int
	Since      time.Time
}

// New returns a limiter of one line per window per key, remembering at
// most max keys, reading the time from now.
func New[K comparable](window time.Duration, max int, now func() time.Time) *Limiter[K] {
	return &Limiter[K]{window: window, max: max, now: now, keys: map[K]*entry{}}
}

// Note records an occurrence of k now and says whether to log it: the
// first of k, or the first after k was quiet for a window, is logged;
// the others once a window has passed since k was last logged, with how
// many were not.
func (l *Limiter[K]) Note(k K) Verdict {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.keys[k]
	if e == nil && len(l.keys) >= l.max {
		for old, oe := range l.keys {
			if now.Sub(oe.last) >= l.window {
				delete(l.keys, old)
			}
		}
		if len(l.keys) >= l.max {
			var shared K // the entry beyond the bound
			k, e = shared, l.keys[shared]
		}
	}
	switch {
	case e == nil || now.Sub(e.last) >= l.window:
		l.keys[k] = &entry{logged: now, last: now}
		return Verdict{Log: true}
	case now.Sub(e.logged) < l.window:
		e.suppressed++
		e.last = now
		return Verdict{}
	default:
		v := Verdict{Log: true, Suppressed: e.suppressed, Since: e.logged}
		*e = entry{logged: now, last: now}
		return v
	}
}

// Remembers reports whether k has an entry of its own, and Len how many
// entries the limiter holds (the bound's tests).
func (l *Limiter[K]) Remembers(k K) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.keys[k]
	return ok
}

// Len is the number of entries the limiter holds, the shared one
// included: at most max+1.
func (l *Limiter[K]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}
