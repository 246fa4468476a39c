// Package rpc is the one home of node-to-node traffic: what one node asks
// of another's replica, in both directions.
//
//   - wire.go: the batch format (BatchPath), operations and results;
//   - peer.go: Peer, the client of one other node, which batches the
//     coordinator's replica calls onto it in read and write lanes;
//   - server.go: Server, the receiving side, which validates a batch and
//     applies it to the local replica in one store commit; it is free of
//     any transport, and package httpapi mounts it;
//   - stream.go: a node's records as a stream (StreamPath), its client and
//     its server side, for cluster-wide range scans.
//
// A replicated write travels coordinator (package cluster) → Peer →
// HTTP → httpapi's mount → Server.ServeBatch → replica.ApplyBatch → Pebble.
//
// Every request carries SecretHeader when the cluster has a secret; a node
// serves only requests that carry it (Server.Authorized).
package rpc
