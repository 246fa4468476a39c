// Package client is the Go client of dhtkv, the Dynamo-style key-value
// store: Get, Put (WithTTL to expire), Delete, Stat (a key's version,
// size and expiry without its value) and Scan against a cluster through
// any of its nodes, with the per-request replication (ack of from) of
// the HTTP API, failover across several endpoints, and typed errors for
// the answers a program acts on. It uses only the standard library's net/http.
//
// # Errors
//
//   - ErrNotFound: GET (Get) or HEAD (Stat) answered 404, the key is
//     absent, deleted or expired.
//   - ErrNotEnoughReplicas: the node answered 504, fewer than ack of the
//     key's replicas answered in time. The write may or may not have been
//     stored by some replicas; retrying later is the caller's choice.
//   - *BadRequestError: any other 4xx (a bad key, ack or from, a value
//     over the node's limit: 413), with the node's one-line reason.
//   - ErrUnavailable: no endpoint could serve the request (see Failover);
//     the message lists each endpoint's failure. With it
//     ErrInsufficientStorage when every endpoint refused a write with
//     507: their disks are below --min-free-space, or failed.
//   - ErrAnswerTooLarge: the answer was longer than
//     Config.MaxRecordBytes; it does not fail over.
//   - the context's error when it ended first.
//
// # Failover
//
// A call goes first to the endpoint that served the previous call, and
// on to the next ones in the Config's order, each at most once, when that
// one
//
//   - cannot be reached, or drops the connection before its whole answer
//     arrived (a Scan: before the stream began), or
//   - answers 500, 502 or 503: the node failed, is shutting down, or
//     refuses to coordinate writes because its clock is off from its
//     peers' or not verified by a majority of them; or 507: its own disk
//     is full or failed, so it refuses to coordinate writes; or 429: it
//     serves as many range scans as its --max-scans allows, or holds as
//     many connections from this address as --max-connections-per-ip
//     does. Another node may well succeed.
//
// It does not fail over on answers about the request or the data: 2xx,
// 404, the other 4xx (a *BadRequestError), and 504. A value of 1 MiB or more is announced
// before it is sent (Expect: 100-continue), so that a node refuses one
// over its --max-value-bytes from its length alone: the 413 then comes
// before any of the value is sent, never as a connection reset midway,
// which would fail over. A 504 says that fewer than ack of the key's
// replicas answered; those replicas are the same whichever node
// coordinates, so asking another node would add load to a cluster already
// short of replicas and, almost always, end the same way.
//
// A write that failed over may have been stored by the node that dropped
// the connection. PUT and DELETE carry the whole value, so storing one
// twice leaves the same data, except that the second may supersede a
// write that another client made in between.
//
// The context bounds a whole call, every endpoint tried and, for Scan, the
// whole stream. Config.DialTimeout bounds connecting to one endpoint, so
// that an unreachable one costs that long rather than the whole deadline;
// a node that accepts the connection and then does not answer holds the
// call until the context ends.
//
// The HTTP API is described in the repository's README.md and
// docs/range-scans.md.
package client
