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
