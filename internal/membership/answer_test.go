package membership

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// A change's request is answered by what became of it: 202 with its first
// map, 409 when the log refused it, 503 when the log did not answer in
// time (no leader), with a reason that says the change may still be
// applied, and 500 when this node failed.
func TestAnswerStatus(t *testing.T) {
	m, err := clustermap.Seed([]string{"http://n1:1"}, 1)
	require.NoError(t, err)
	notAnswered := fmt.Errorf("membership: join through the cluster map's log: %w",
		fmt.Errorf("maplog: join not answered: %w (last: %w)", context.DeadlineExceeded, errors.New("connection refused")))
	for _, tc := range []struct {
		name string
		err  error
		code int
		want string
	}{
		{"accepted", nil, http.StatusAccepted, ""},
		{"refused", fmt.Errorf("%w: another change is under way", ErrChangeRefused), http.StatusConflict, "another change is under way"},
		{"not answered", notAnswered, http.StatusServiceUnavailable, "the cluster map's log did not answer within 30s: it has no leader"},
		{"this node failed", errors.New("install: disk full"), http.StatusInternalServerError, "disk full"},
	} {
		var code int
		var got error
		answer(func(c int, _ any) { code = c }, func(c int, err error) { code, got = c, err }, m, tc.err)
		require.Equal(t, tc.code, code, tc.name)
		if tc.want != "" {
			require.ErrorContains(t, got, tc.want, tc.name)
		}
	}
	require.ErrorContains(t, func() error {
		var got error
		answer(func(int, any) {}, func(_ int, err error) { got = err }, m, notAnswered)
		return got
	}(), "the change may still be applied, see GET /cluster before asking again")
}
