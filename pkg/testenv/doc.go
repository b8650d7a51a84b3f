// Package testenv is allot's one harness for integration tests against real servers: a
// single Redis, a Redis Cluster (masters, optional replicas) and an etcd cluster (1, 3 or 5
// members), each in Docker containers started with github.com/ory/dockertest/v3; any other
// process (allot's own binaries, nginx, Caddy) from the local stack image (Run,
// StackImage); and TCP links with latency, cuts and blackholes (Links: Toxiproxy as a
// library, in-process); and an OpenTelemetry trace receiver (OTLP over gRPC) in the test's
// process that keeps the spans it is sent (StartOTLP). e2e/stack builds the three-region
// stack from these.
//
// What it guarantees:
//
//   - Everything listens on 127.0.0.1 only. Containers run with host networking, and the
//     harness picks free loopback ports (below the kernel's ephemeral range) for every
//     server, so tests talk only to loopback.
//   - A constructor returns only once the servers are ready, found by bounded polling
//     (never a fixed sleep): Redis answers and is the server this test started (checked by a
//     unique dbfilename, so a port taken by someone else between choosing and binding is
//     detected and retried with new ports); a cluster is built and every node agrees on the
//     slot map; etcd reports healthy with a leader. It fails the test (t.Fatal) otherwise,
//     with the container's last log lines.
//   - Containers are removed at t.Cleanup, even when the test fails (their last log lines
//     are logged first when it did). A test binary that is killed cannot run its cleanups,
//     so every container also carries labels (allot-test=1, its owner process and an
//     expiry); the next harness run in any test binary removes containers whose owner
//     process is gone or whose expiry has passed, and with the local image the server runs
//     under timeout(1) so it exits at its expiry anyway. All names start with
//     "allot-test-"; `make clean-containers` removes every such container by hand.
//   - The stack image (allot/stack:<content hash>: the base, Debian's nginx and caddy, and
//     allot's static binaries) is built by `scripts/images.sh stack` on the first
//     StackImage call of a test binary, under the same lock: the first time a minute or
//     more (apt for nginx and caddy, then go build), later only the go build's cache
//     check and a hash.
//   - Images are never pulled in the default mode. Before the first container, Require
//     checks that the base image exists and, if not, runs the repository's
//     scripts/images.sh once (under a lock file in os.TempDir(), so concurrent test
//     binaries do not build it twice). That takes a few minutes, once per machine.
//
// Skipping: Require (which every constructor calls) skips the test under -short, and when
// no Docker daemon answers; with CI=true a missing daemon fails the test instead, so CI
// cannot pass by skipping.
//
// Environment variables:
//
//	ALLOT_BASE_IMAGE          local base image tag (default allot/base:bookworm-1), the one
//	                          scripts/images.sh builds: redis-server 7.0 and etcd 3.4.
//	ALLOT_UPSTREAM_IMAGES=1   use upstream images instead, for machines with registry
//	                          access: ALLOT_REDIS_IMAGE (default redis:7) and
//	                          ALLOT_ETCD_IMAGE (default quay.io/coreos/etcd:v3.5.17). These
//	                          are pulled when missing; no build is run, and the servers are
//	                          not wrapped in timeout(1) (the etcd image has no shell tools).
//	ALLOT_TEST_CONTAINER_TTL  how long a container may live (Go duration, default 1h).
//	DOCKER_HOST               the Docker endpoint, as for the docker CLI.
//	CI=true                   fail instead of skipping when Docker is missing.
//
// Timing figures worth knowing (measured on a loaded 2-core machine; Redis Cluster runs
// with cluster-node-timeout 2 s by default):
//
//   - Startup: a single Redis or etcd member 1–3 s (mostly Docker creating the
//     container); a 3-master cluster 4–7 s, of which about 2 s is Redis's own floor
//     (a master waits 2 s after start, and node-timeout after joining, before it says
//     cluster_state:ok); 3 masters × 1 replica 7–10 s; a 3-member etcd 3–7 s.
//   - A paused master with a replica: the others flag it failing after the node timeout
//     and its replica is promoted about a second later; Cluster.WaitOK returns 3–5 s
//     after Pause. A go-redis cluster client (2 s timeouts) writes to the promoted replica
//     about 8–9 s after Pause: its commands first time out against the paused master.
//     Unpaused, the old master rejoins as a replica.
//   - A master without replicas that is paused or stopped for longer than the node
//     timeout is flagged FAIL by the others; its slots are unserved meanwhile (the other
//     masters keep serving theirs). Back, it serves them again after Redis's rejoin
//     delays (a few seconds; the others clear the flag 2 × node timeout after setting
//     it): Stop, Start, WaitOK took 5–8 s.
//   - etcd (heartbeat 100 ms, election timeout 1 s): with the leader of 3 stopped, writes
//     succeed again within about 1 s; a stopped member is healthy 1–3 s after Start.
//   - Pause and Unpause take about 0.1–0.3 s, Stop about 0.5 s (SIGTERM).
//
// Clients handed out by the harness (Node.Client, Cluster.Client, EtcdCluster.Client) are
// new on every call and closed at the cleanup of the test that created the node or
// asked for the client; closing them earlier is harmless.
//
// Concurrency: constructors may be called from parallel tests. The methods of one Node or
// EtcdMember that change its state (Pause, Unpause, Stop, Start) must not be called
// concurrently with each other; everything else is safe for concurrent use.
package testenv
