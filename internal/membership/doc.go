// Package membership is how this node's cluster map is taken, installed,
// changed and acted on: the map a node starts with (bootstrap.go), its
// install behind the epoch gate and the view every protocol routes by
// (service.go), the map state nodes exchange (state.go), the changes
// asked of this node as commands of the cluster map's log (change.go,
// logged.go), the copy and drop of the partitions a change moves
// (move.go), and the admin /cluster endpoints (admin.go). The map itself,
// a pure value, is package clustermap's; how it places keys is package
// placement's; the log that orders the maps is package maplog's
// (docs/membership.md).
//
// Where a membership change goes through the code, in order:
//
//  1. Service.Join (or Decommission, SetReplicas, Replace, Abort) submits
//     a command to the log, made from the log's current epoch; the log
//     applies it or refuses it with the reason (of two changes asked at
//     once, one is refused, never both accepted);
//  2. every member installs each map the log applies (follow, behind the
//     gate) and acknowledges its epoch to the log;
//  3. in the stream stage each gaining node's mover copies its partitions
//     (a partition stream from one old replica, package partcopy, then a
//     pull-only anti-entropy exchange with each other one) and reports
//     the copy to the log;
//  4. the log advances the stage once every member acknowledged it (and,
//     in the stream stage, every gaining node reported its copy); once
//     the change is over, every node's mover drops the partitions it no
//     longer holds (as it does at every start with no change under way).
package membership
