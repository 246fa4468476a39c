// Package history records what concurrent clients did to a key-value
// store, and checks the record against the store's promises once the faults
// are over.
//
// The model: every key is written by one client only, one write at a time,
// and every write of a key puts a value no other write of that key puts (or
// deletes the key). The writes of a key therefore have a total issue order,
// indexed 1..n; index 0 stands for the key's initial state, not found. That
// order is the order a last-write-wins store with sane clocks must keep:
// each write's version is newer than every earlier-issued write's.
//
// Every operation has a call time and a return time, read from one
// monotonic clock in one process (as offsets from the recorder's start),
// and an outcome:
//
//   - OK: the store acknowledged it. An acknowledged write took effect
//     between its call and its return.
//   - Failed: the store said definitely not (a 4xx): the write never took
//     effect and no read may return it.
//   - Unknown: a timeout, a 504, a connection error: the write may have
//     taken effect, or not, or may take effect later; a read with this
//     outcome returned nothing usable.
//
// Each check returns the violations of one promise, each naming its key,
// operations and times: CheckReads (no acknowledged write lost, no stale
// read), CheckMonotonic (reads never go back), CheckFinal (the converged
// state keeps every acknowledged write), CheckReplicas (replicas hold the
// same bytes) and, for small histories, CheckLinearizable. A Recorder
// collects a history from concurrent clients and saves it as JSON lines.
package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind is what an operation does.
type Kind string

const (
	Write Kind = "write" // put a value, or delete the key (Op.Delete)
	Read  Kind = "read"  // get the key's value
)

// Outcome is what the client learnt about an operation.
type Outcome string

const (
	OK      Outcome = "ok"      // acknowledged (a read: Found and Value hold its result)
	Failed  Outcome = "failed"  // definitely not applied
	Unknown Outcome = "unknown" // maybe applied, maybe later; a read learnt nothing
)

// Op is one operation of a history.
type Op struct {
	ID      int           `json:"id"` // unique in the history, in call order
	Client  string        `json:"client"`
	Kind    Kind          `json:"kind"`
	Key     string        `json:"key"`
	Value   string        `json:"value,omitempty"`  // a write's value, or an OK read's
	Delete  bool          `json:"delete,omitempty"` // a write that deletes the key
	Found   bool          `json:"found,omitempty"`  // an OK read that returned a value
	Call    time.Duration `json:"call_ns"`          // since the recorder's start
	Return  time.Duration `json:"return_ns"`        // since the recorder's start
	Outcome Outcome       `json:"outcome"`
	Err     string        `json:"err,omitempty"` // why a Failed or Unknown op ended so
}

// String describes the operation on one line, e.g.
//
//	#7 c1 write k="v3" [120ms,135ms] ok
//	#9 c2 read k -> "v3" [130ms,141ms]
//	#11 c2 read k -> not found [150ms,152ms]
func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s %s", o.ID, o.Client, o.Kind, o.Key)
	switch {
	case o.Kind == Write && o.Delete:
		b.WriteString(" (delete)")
	case o.Kind == Write:
		fmt.Fprintf(&b, "=%q", o.Value)
	case o.Outcome == OK && o.Found:
		fmt.Fprintf(&b, " -> %q", o.Value)
	case o.Outcome == OK:
		b.WriteString(" -> not found")
	}
	fmt.Fprintf(&b, " [%v,%v]", o.Call, o.Return)
	if o.Kind == Write || o.Outcome != OK {
		fmt.Fprintf(&b, " %s", o.Outcome)
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " (%s)", o.Err)
	}
	return b.String()
}

// History is a recorded history.
type History struct {
	// Start is the wall-clock time of offset 0, to match operations with
	// the store's logs. The checks use only the offsets.
	Start time.Time
	Ops   []Op
}

// header is the first line of a saved history.
type header struct {
	Start time.Time `json:"start"`
}

// Save writes h to path as JSON lines: a header with Start, then one
// operation per line. Keys and values must be valid UTF-8, which JSON
// carries unchanged.
func (h History) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("history: save: %w", err)
	}
	w := bufio.NewWriter(f)
	err = h.encode(w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("history: save %s: %w", path, err)
	}
	return nil
}

func (h History) encode(w io.Writer) error {
	enc := json.NewEncoder(w)
	if err := enc.Encode(header{Start: h.Start}); err != nil {
		return err
	}
	for _, o := range h.Ops {
		if !utf8.ValidString(o.Key) || !utf8.ValidString(o.Value) {
			return fmt.Errorf("op #%d: key or value is not valid UTF-8", o.ID)
		}
		if err := enc.Encode(o); err != nil {
			return fmt.Errorf("op #%d: %w", o.ID, err)
		}
	}
	return nil
}

// Load reads a history that Save wrote.
func Load(path string) (History, error) {
	f, err := os.Open(path)
	if err != nil {
		return History{}, fmt.Errorf("history: load: %w", err)
	}
	defer f.Close()
	h, err := decode(f)
	if err != nil {
		return History{}, fmt.Errorf("history: load %s: %w", path, err)
	}
	return h, nil
}

func decode(r io.Reader) (History, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var hd header
	if err := dec.Decode(&hd); err != nil {
		return History{}, fmt.Errorf("header: %w", err)
	}
	h := History{Start: hd.Start}
	for {
		var o Op
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return h, nil
		}
		if err != nil {
			return History{}, fmt.Errorf("op %d: %w", len(h.Ops)+1, err)
		}
		h.Ops = append(h.Ops, o)
	}
}
