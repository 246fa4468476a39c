package queryparam

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBool(t *testing.T) {
	for _, tc := range []struct {
		query string
		def   bool
		want  bool
		err   string
	}{
		{query: "", def: true, want: true},
		{query: "", def: false, want: false},
		{query: "other=0", def: true, want: true},
		{query: "force", want: true},
		{query: "force=", def: false, want: true},
		{query: "force=1", want: true},
		{query: "force=t", want: true},
		{query: "force=TRUE", want: true},
		{query: "force=True", want: true},
		{query: "force=0", def: true, want: false},
		{query: "force=f", def: true, want: false},
		{query: "force=FALSE", def: true, want: false},
		{query: "force=1&force=true", want: true},
		{query: "force&force=1", want: true},
		{query: "force=0&force=false", def: true, want: false},
		{query: "force=yes", err: `force="yes": want true or false (1 or 0; the name alone is true)`},
		{query: "force=tRuE", err: `force="tRuE": want true or false (1 or 0; the name alone is true)`},
		{query: "force=%20", err: `force=" ": want true or false (1 or 0; the name alone is true)`},
		{query: "force&force=0", err: "force given 2 times with different values: give it once"},
		{query: "force=1&force=1&force=0", err: "force given 3 times with different values: give it once"},
		{query: "force=0&force=x", err: `force="x": want true or false (1 or 0; the name alone is true)`},
	} {
		q, err := url.ParseQuery(tc.query)
		if !assert.NoError(t, err, tc.query) {
			continue
		}
		got, err := Bool("force", q["force"], tc.def)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, tc.query)
			continue
		}
		if assert.NoError(t, err, tc.query) {
			assert.Equal(t, tc.want, got, tc.query)
		}
	}
}

func TestOne(t *testing.T) {
	for _, tc := range []struct {
		query, want, err string
	}{
		{query: ""},
		{query: "other=1"},
		{query: "dir=", want: ""},
		{query: "dir=a", want: "a"},
		{query: "dir=a&dir=a", want: "a"},
		{query: "dir=%61&dir=a", want: "a"}, // the same value, spelled otherwise
		{query: "dir=a&dir=b", err: "dir given 2 times with different values: give it once"},
		{query: "dir=a&dir=a&dir=", err: "dir given 3 times with different values: give it once"},
		{query: "dir&dir=a", err: "dir given 2 times with different values: give it once"},
	} {
		q, err := url.ParseQuery(tc.query)
		if !assert.NoError(t, err, tc.query) {
			continue
		}
		got, err := One("dir", q["dir"])
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, tc.query)
			continue
		}
		assert.NoError(t, err, tc.query)
		assert.Equal(t, tc.want, got, tc.query)
	}
}

func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		query, usage string
		known        []string
		err          string
	}{
		{query: "", known: nil},
		{query: "node=x&force", known: []string{"node", "force"}},
		{query: "node=x", known: []string{"node", "with"}},
		{query: "url=x", usage: "node=URL", known: []string{"node"}, err: `unknown parameter "url": node=URL`},
		{query: "foo=1", known: nil, err: `unknown parameter "foo": this endpoint takes none`},
		{query: "b=1&a=1", usage: "u", known: nil, err: `unknown parameter "a": u`}, // the first in order: the same answer every time
		{query: "node=%zz", known: []string{"node"}, err: `malformed query: invalid URL escape "%zz"`},
		{query: "node=x;y", known: []string{"node"}, err: "malformed query: invalid semicolon separator in query"},
	} {
		_, err := Strict(tc.query, tc.usage, tc.known...)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err, tc.query)
			continue
		}
		assert.NoError(t, err, tc.query)
	}
}
