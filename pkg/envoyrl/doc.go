// Package envoyrl loads envoyproxy/ratelimit's YAML configuration files strictly into a
// model (issue 23, §2's first bullet). pkg/rules serves it: rules.FromEnvoy turns the
// model into descriptor rules and rules.EnvoyDirSource watches a directory of the files.
//
// The rules mirror envoyproxy/ratelimit's loader (src/config/config_impl.go): a file it
// rejects, Parse rejects, naming file and line and every problem of the file at once,
// not only the first. Where envoyproxy/ratelimit accepts a file but silently ignores or
// overrides part of it (a known key where it has no meaning, a duplicated mapping key, a
// unit beside unlimited: true, ...), Parse accepts the file too, so the switch stays a
// change of image, and says so in Config.Warnings.
package envoyrl
