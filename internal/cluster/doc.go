// Package cluster coordinates client requests across the replicas of a
// key: the coordinator (fan-out, ack counting, newest version wins, read
// hedging, read repair, cluster-wide scans) and, for now, the background
// protocols that keep replicas in step. Placement is package placement's;
// the cluster map is package membership's. It reaches other nodes through
// package rpc.
package cluster
