// Package membership is how this node's cluster map is taken, installed,
// changed and acted on: the map a node starts with (bootstrap.go), its
// install behind the epoch gate and the view every protocol routes by
// (service.go), the map state nodes exchange (state.go), the driver that
// takes a change through its stages (change.go), or, with Options.Log,
// the changes made through the map's log instead (logged.go), the copy
// and drop of the partitions a change moves (move.go), and the admin
// /cluster endpoints (admin.go). The map itself, a pure value, is package clustermap's; how
// it places keys is package placement's (docs/membership.md).
//
// Where a membership change goes through the code, in order:
//
//  1. Service.Join (or Decommission, SetReplicas, Replace) checks every
//     member agrees, and installs the change's first map here; this node
//     drives it;
//  2. the driver hands each stage's map to every member (barrier), each
//     of which installs it by Service.Offer behind the gate;
//  3. in the stream stage each gaining node's mover copies its partitions
//     (a partition stream from one old replica, package partcopy, then a
//     pull-only anti-entropy exchange with each other one) and reports
//     the stage moved;
//  4. the driver advances the stage; once the change is over, every node's
//     mover drops the partitions it no longer holds (as it does at every
//     start with no change under way).
//
// With the map's log, 1 is a command of the log (one of two changes
// asked at once is refused, never both accepted), 2 is each node
// installing what the log applied and acknowledging it, and the log
// itself advances the stage in 4 once every member acknowledged it.
package membership
