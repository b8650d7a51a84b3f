// Package helm holds the tests of the Helm chart in deploy/helm/allot (issue 24 §3): one
// region's allot stack per release — the enforcers, and where enabled the quota balancer's
// replicas — over an external Redis Cluster and etcd.
//
// The tests run the real helm, built from the Go module proxy into bin/tools by
// scripts/helm.sh (the first build takes minutes; later runs find it): `helm lint`, and
// `helm template` of every region's values file compared with golden files under
// testdata/ (`go test ./deploy/helm/ -run TestTemplateGolden -update` rewrites them).
// Every rendered container's command line, environment and mounted files are then given
// to the real binary's own check (`enforcer -check-config`, `balancer -check-config`):
// a flag or an ALLOT_* variable the binary does not read, or a file it names that the
// pod would not have, fails the test. The chart's copies of the shipped files (the example
// rules, the alert rules, the Grafana dashboard) are held equal to configs/, and its
// per-region config to configs/regions/ and configs/balancer.yaml, but for the fields that
// Kubernetes sets.
//
// The package has no code of its own.
package helm
