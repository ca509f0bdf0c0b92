//go:build tools

// Package tools pins metrics-server, which tools/k8s/build.sh builds for the local cluster's
// autoscaler: the HorizontalPodAutoscaler reads pod CPU through its resource metrics API.
package tools

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
