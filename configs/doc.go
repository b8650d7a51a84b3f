// Package configs holds no code: it is the home of the shipped configuration (regions,
// rules, envoyproxy/ratelimit's README examples in its runtime layout under
// envoy-ratelimit/config, the Grafana dashboard, the Prometheus alert rules) and of the
// tests that hold that configuration to the code. Its tests check that every PromQL
// expression of grafana/allot.json and prometheus/allot-rules.yaml names only metrics the
// processes really register (gathered from an enforcer built in-process), and run
// `promtool check rules` and `promtool test rules` on the alert rules (promtool comes from
// Debian's prometheus package, installed by scripts/tools.sh when missing; under CI=true a
// missing promtool fails the test instead of skipping it).
package configs
