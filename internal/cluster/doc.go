// Package cluster coordinates client requests across the replicas of a
// key: the coordinator routes each request by the installed view (package
// view, from membership), fans it out to the key's replicas (fanout.go),
// counts acks, keeps the newest version, hedges slow reads (hedge.go),
// repairs the stale replicas a read found (repair.go), and merges every
// node's stream for cluster-wide scans (scan.go). A write a replica missed
// goes to hinted handoff (package handoff). It reaches other nodes through
// view.Peer, whose implementation is package rpc's.
package cluster
