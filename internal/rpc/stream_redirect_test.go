package rpc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestStreamClientDoesNotForwardSecretOnRedirect: an internal stream is
// node to node; an answer that redirects it elsewhere is not followed, so
// the cluster secret goes to the member asked and nowhere else.
func TestStreamClientDoesNotForwardSecretOnRedirect(t *testing.T) {
	got := make(chan string, 1)
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Get(SecretHeader):
		default:
		}
		http.Error(w, "no", http.StatusTeapot)
	}))
	defer elsewhere.Close()
	member := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/anything", http.StatusTemporaryRedirect)
	}))
	defer member.Close()

	c := NewStreamClient(StreamOptions{OpenTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second, Secret: "the-cluster-secret", MaxKey: 1024, MaxEnvelope: 1 << 20})
	defer c.Close()
	it, err := c.Open(context.Background(), member.URL, 1, []byte("a"), nil)
	if err == nil {
		it.Close()
	}
	select {
	case s := <-got:
		t.Fatalf("the stream followed the member's redirect to %s and sent it the cluster secret %q", elsewhere.URL, s)
	default:
	}
	if err == nil {
		t.Fatal("a redirect answered the stream: want an error")
	}
}
