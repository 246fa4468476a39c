package node

// left is called once the cluster map no longer has this node: it was
// decommissioned. The process stops (Left).
func (n *Node) left() {
	select {
	case n.leftCh <- struct{}{}:
	default:
	}
}

// Left fires when the node was decommissioned: it holds no partition any
// more and should stop; its data directory cannot be started again.
func (n *Node) Left() <-chan struct{} { return n.leftCh }

// admissible checks that a node URL may join under this node's security
// settings: without a secret or mutual TLS, only loopback ones
// (security.go).
func (n *Node) admissible(url string) error { return checkExposure(n.cfg, []string{url}) }
