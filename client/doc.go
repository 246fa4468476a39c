// Package client is the Go client of dhtkv, the Dynamo-style key-value
// store: Get, Put, Delete and Scan against a cluster through any of its
// nodes, with the per-request replication (ack of from) of the HTTP API,
// failover across several endpoints, and typed errors for the answers a
// program acts on (ErrNotFound, ErrNotEnoughReplicas, *BadRequestError).
// It uses only the standard library's net/http.
//
// The HTTP API it speaks is described in the repository's README.md and
// docs/range-scans.md.
package client
