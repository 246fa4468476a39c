// Package worker runs a component's background goroutines under one
// lifecycle: each is given the group's context, and Stop cancels it and
// waits for all of them. Every background loop of a node runs in a Group,
// so that stopping a component is one call that returns only once nothing
// of it runs.
package worker

import (
	"context"
	"sync"
	"time"
)

// Group is a set of goroutines stopped together. The zero value is not
// usable: make one with New. Its methods are safe for concurrent use.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// mu orders Go's Add against Stop's cancel: no goroutine is added
	// once Stop has begun waiting.
	mu      sync.Mutex
	stopped bool
}

// New returns a group whose goroutines run until Stop.
func New() *Group {
	ctx, cancel := context.WithCancel(context.Background())
	return &Group{ctx: ctx, cancel: cancel}
}

// Context is cancelled by Stop.
func (g *Group) Context() context.Context { return g.ctx }

// Stopping reports whether Stop was called.
func (g *Group) Stopping() bool { return g.ctx.Err() != nil }

// Go runs f in a goroutine of the group and reports true; after Stop it
// runs nothing and reports false.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return false
	}
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		f(g.ctx)
	}()
	return true
}

// Every runs f now and then every interval, until Stop.
func (g *Group) Every(interval time.Duration, f func(ctx context.Context)) {
	g.Go(func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			f(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// Tick runs f every interval, the first time an interval from now, until
// Stop.
func (g *Group) Tick(interval time.Duration, f func(ctx context.Context)) {
	g.Go(func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f(ctx)
			}
		}
	})
}

// Sleep waits d or until Stop; it reports whether d passed.
func (g *Group) Sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Stop cancels the group's context and waits for its goroutines to
// return. It may be called more than once.
func (g *Group) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.cancel()
	g.mu.Unlock()
	g.wg.Wait()
}
