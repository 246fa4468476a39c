// Package e2e holds dhtkv's whole-cluster tests: real nodes on real ports
// (package testcluster), real processes where restarts and SIGKILL
// matter, driven through the public and internal HTTP APIs. Unit tests
// stay beside the code they test; what needs several nodes lives here.
package e2e
