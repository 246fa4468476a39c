package admin

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// POST /debug/pprof/symbol read its whole body, however large, and
// answered a line ("0x... full.function.Name") per program counter in it,
// buffered in memory until the end: a body of N bytes made the node hold
// several times N, bounded only by what the client sends within
// --admin-read-timeout. A body over 1 MiB is refused with 413.
func TestSymbolBodyBounded(t *testing.T) {
	pc := fmt.Sprintf("%#x+", reflect.ValueOf(TestSymbolBodyBounded).Pointer())
	body := strings.Repeat(pc, (16<<20)/len(pc)) // 16 MiB
	h := Handler(prometheus.NewRegistry(), func() error { return nil }, 0)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/debug/pprof/symbol", strings.NewReader(body)))
	n, _ := io.Copy(io.Discard, w.Body)
	t.Logf("status %d: a %d-byte body made a %d-byte answer", w.Code, len(body), n)
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code, "a body far beyond what a symbol lookup needs is refused")
}
