// Package rpc is the one home of node-to-node traffic: what one node asks
// of another's replica, in both directions.
//
//   - wire.go: the batch format (BatchPath), operations and results;
//   - peer.go: Peer, the client of one other node, which batches the
//     coordinator's replica calls onto it in read and write lanes;
//   - server.go: Server, the receiving side, which validates a batch and
//     applies it to the local replica in one store commit
//     (replica.ApplyRemote: a write whose version is more than
//     --max-clock-skew ahead of its clock is refused, that write alone);
//   - handler.go: the server side of the transport: which caller and
//     method each internal endpoint accepts, and what it answers with
//     which status and headers; package httpapi routes the paths to it
//     and reads the bodies within the node's body budget;
//   - direct.go: Direct, a peer reached in-process, the transport seam's
//     second implementation beside Peer;
//   - stream.go: a node's records as a stream (StreamPath), its client and
//     its server side, for cluster-wide range scans and, restricted to
//     some partitions, for partition copies (package partcopy);
//   - summary.go: the anti-entropy summary exchange (SummaryPath): partition
//     and segment hashes, then the (key, version) lists of the segments
//     that differ, never a value; the records themselves then travel in
//     ordinary batches;
//   - epoch.go: the cluster map's epoch that every batch, ping and summary
//     request carries (EpochHeader), which lets a node refuse calls routed
//     by an older map (409 with its map) and hand its map to a peer that
//     is behind; the map exchange itself (MapPath); Maps, through which
//     the owner of the map answers them;
//   - clock.go: the answering node's clock on every batch answer
//     (TimeHeader), from which Peer measures how far the peer's clock is
//     off (Peer.ClockOffset) at no extra exchange, and Ping, the empty
//     batch that measures it and asks whether the cluster has formed
//     (FormedHeader) while no request needs the peer.
//
// A replicated write travels coordinator (package cluster) → Peer →
// HTTP → httpapi's mount → Server.Admit → Server.ServeBatch →
// replica.ApplyBatch → Pebble.
//
// Every request carries SecretHeader when the cluster has a secret; a node
// serves only requests that carry it (Server.Authorized).
package rpc
