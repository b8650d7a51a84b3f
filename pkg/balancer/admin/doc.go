// Package admin is the balancer's admin API: HTTP JSON under /v1/admin/ to list, read,
// change and delete the rules the enforcers watch in etcd (one rule per key under the
// rules prefix, rules.EtcdSource's format) and per-key overrides, to check a rule file
// without applying it, to read an identity's current shares, to read the audit log and to
// ask every region's enforcers "why was this key limited?".
//
//	GET    /v1/admin/rules              every rule in etcd, and the revision read
//	PUT    /v1/admin/rules              apply a rule file (ApplyRequest): upsert its rules
//	GET    /v1/admin/rules/{id}         one rule
//	PUT    /v1/admin/rules/{id}         write one rule (RuleRequest)
//	DELETE /v1/admin/rules/{id}         delete one rule (?reason=)
//	GET    /v1/admin/overrides          the per-key overrides (rules matching one api_key)
//	GET    /v1/admin/overrides/{key}    one key's override
//	PUT    /v1/admin/overrides/{key}    set it (OverrideRequest: limits, expires_at, reason)
//	DELETE /v1/admin/overrides/{key}    delete it (?reason=)
//	POST   /v1/admin/check              dry run: check a rule file (CheckRequest), write nothing
//	GET    /v1/admin/shares/{key}       an api key's shares (the core's when leading, else etcd's)
//	GET    /v1/admin/audit              the newest audit records (?limit=, default 50)
//	GET    /v1/admin/explain?api_key=…  /v1/explain of every registered enforcer, by region
//
// # Auth
//
// Every route needs "Authorization: Bearer <token>" with one of the configured named tokens
// (pkg/adminauth: file or environment variable, compared in constant time); without one,
// or with a wrong or malformed one, the answer is 401 and nothing is read. Serve it over
// TLS (admin.tls in the balancer config) anywhere but loopback.
//
// # Changes
//
// Every change carries the revision the caller read (If-Match header or "revision"
// field) and a reason. The server reads the rules prefix, applies the change to it, parses
// and compiles the whole resulting set the way every enforcer will (rules.EtcdSet over the
// base file, rules.Compile with the balancer's regions), and writes it in one etcd
// transaction — the rule puts and deletes, the audit record and the change marker — that
// lands only if no key under the rules prefix was written after that revision and no
// admin change landed after it. So nothing partial is ever written, a set that would be
// rejected is refused whole (400, every problem naming key or file, rule, field and line),
// and two admins never overwrite each other blindly: the second gets 409 and reads again.
// The revision is over the whole prefix, not one key, because the set is checked as a
// whole (two rules with one id in different keys are an error of neither alone). Direct
// etcdctl deletes under the prefix are the one change the compare cannot see.
//
// # Audit
//
// Each change writes one AuditRecord (who: the token's name, when, action, rule ids,
// reason, the revision read) under the audit prefix in the change's own transaction. The
// newest Config.AuditKeep (default 1000) are kept: older ones are deleted after each
// change.
package admin
