{{/* The release's name prefix for every object: the release name, cut to leave room for a suffix. */}}
{{- define "allot.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The region this release serves: enforcer.config.region, required. */}}
{{- define "allot.region" -}}
{{- required "enforcer.config.region is required: install with the region's values file (values-<region>.yaml)" .Values.enforcer.config.region -}}
{{- end -}}

{{- define "allot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels on every object; "component" is enforcer, balancer or monitoring. */}}
{{- define "allot.labels" -}}
app.kubernetes.io/name: allot
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: allot
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
allot.dev/region: {{ include "allot.region" .root }}
{{- end -}}

{{/* The selector of one component's pods (a subset of allot.labels that never changes). */}}
{{- define "allot.selector" -}}
app.kubernetes.io/name: allot
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The enforcer's config file: enforcer.config with the fields the chart owns set. */}}
{{- define "allot.enforcer.config" -}}
{{- $v := .Values.enforcer -}}
{{- $cfg := deepCopy $v.config -}}
{{- $_ := set $cfg "listen" (merge (dict "grpc" (printf ":%v" $v.ports.grpc) "http" (printf ":%v" $v.ports.http)) (deepCopy ($cfg.listen | default dict))) -}}
{{- $_ := set $cfg "rules" (merge (dict "file" "/etc/allot/rules/rules.yaml") (deepCopy ($cfg.rules | default dict))) -}}
{{- if $v.reportTLS.secretName -}}
{{- $b := deepCopy ($cfg.balancer | default dict) -}}
{{- $_ := set $b "tls" (merge (dict "ca_file" "/etc/allot/report-tls/ca.pem" "cert_file" "/etc/allot/report-tls/cert.pem" "key_file" "/etc/allot/report-tls/key.pem") (deepCopy ($b.tls | default dict))) -}}
{{- $_ := set $cfg "balancer" $b -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The balancer's config file: balancer.config with the fields the chart owns set. */}}
{{- define "allot.balancer.config" -}}
{{- $v := .Values.balancer -}}
{{- $cfg := deepCopy $v.config -}}
{{- $l := merge (dict "grpc" (printf ":%v" $v.ports.grpc) "http" (printf ":%v" $v.ports.http)) (deepCopy ($cfg.listen | default dict)) -}}
{{- if $v.tls.secretName -}}
{{- $_ := set $l "tls" (merge (dict "cert_file" "/etc/allot/tls/cert.pem" "key_file" "/etc/allot/tls/key.pem" "client_ca_file" "/etc/allot/tls/ca.pem") (deepCopy ($l.tls | default dict))) -}}
{{- end -}}
{{- $_ := set $cfg "listen" $l -}}
{{- $_ := set $cfg "rules" (merge (dict "file" "/etc/allot/rules/rules.yaml") (deepCopy ($cfg.rules | default dict))) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The rules file's content. */}}
{{- define "allot.rules" -}}
{{- .Values.rules.file | default (.Files.Get "files/rules.yaml") -}}
{{- end -}}

{{/* env entries from a secretEnv map (sorted by name). */}}
{{- define "allot.secretEnv" -}}
{{- range $name := keys . | sortAlpha }}
{{- $s := index $ $name }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "secretEnv.%s.name is required" $name) $s.name }}
      key: {{ required (printf "secretEnv.%s.key is required" $name) $s.key }}
      optional: {{ $s.optional | default false }}
{{- end }}
{{- end -}}
