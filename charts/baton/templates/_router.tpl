{{/* The router image: the GPU image with a GPU, else router.image, else the services image. */}}
{{- define "baton.router.image" -}}
{{- $r := .Values.router -}}
{{- if $r.gpu.enabled -}}
{{- include "baton.image" (dict "root" . "image" $r.gpu.image) -}}
{{- else if $r.image.repository -}}
{{- include "baton.image" (dict "root" . "image" $r.image) -}}
{{- else -}}
{{- include "baton.image" (dict "root" . "image" .Values.image) -}}
{{- end -}}
{{- end -}}

{{- define "baton.router.pullPolicy" -}}
{{- if .Values.router.gpu.enabled -}}
{{- .Values.router.gpu.image.pullPolicy -}}
{{- else -}}
{{- .Values.image.pullPolicy -}}
{{- end -}}
{{- end -}}

{{- define "baton.router.modelClaim" -}}
{{- default (include "baton.componentName" (dict "root" . "component" "models")) .Values.router.modelStorage.existingClaim -}}
{{- end -}}

{{/* The router's additions to the common pod: its image, the model volume and caches, the GPU and a startup probe. */}}
{{- define "baton.router.pod" -}}
{{- $root := .root -}}
{{- $r := .w -}}
{{- $m := $r.modelStorage -}}
{{- $cache := printf "%s/.cache" $m.mountPath -}}
image: {{ include "baton.router.image" $root | quote }}
imagePullPolicy: {{ include "baton.router.pullPolicy" $root }}
strategy:
  {{- toYaml $r.updateStrategy | nindent 2 }}
env:
  # Model downloads and compile caches go to the model volume: the root filesystem is
  # read-only, and a persistent volume makes restarts skip the download.
  - name: HOME
    value: /tmp
  - name: XDG_CACHE_HOME
    value: {{ $cache | quote }}
  - name: HF_HOME
    value: {{ printf "%s/huggingface" $cache | quote }}
  - name: VLLM_CACHE_ROOT
    value: {{ printf "%s/vllm" $cache | quote }}
  - name: TRITON_CACHE_DIR
    value: {{ printf "%s/triton" $cache | quote }}
  {{- if $m.offline }}
  - name: HF_HUB_OFFLINE
    value: "1"
  {{- end }}
  {{- if $r.hfToken.existingSecret }}
  {{- include "baton.secretEnv" (list (dict "env" "HF_TOKEN" "existingSecret" $r.hfToken.existingSecret "existingSecretKey" $r.hfToken.existingSecretKey)) | nindent 2 }}
  {{- end }}
  {{- if $r.conductorApiKey.existingSecret }}
  {{- include "baton.secretEnv" (list (dict "env" (dig "openai" "api_key_env" "" $root.Values.config.conductor) "existingSecret" $r.conductorApiKey.existingSecret "existingSecretKey" $r.conductorApiKey.existingSecretKey)) | nindent 2 }}
  {{- end }}
# Loading the conductor's model can take minutes; liveness starts only after this passes.
startupProbe:
  httpGet:
    path: /health/live
    port: http
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: {{ max 1 (div (int $r.startupTimeoutSeconds) 10) }}
{{- if $r.gpu.enabled }}
{{- $resources := deepCopy $r.resources }}
{{- $_ := set $resources "limits" (merge (dict $r.gpu.resourceName $r.gpu.count) (default dict $resources.limits)) }}
resources:
  {{- toYaml $resources | nindent 2 }}
tolerations:
  {{- toYaml $r.gpu.tolerations | nindent 2 }}
{{- end }}
volumeMounts:
  - name: models
    mountPath: {{ $m.mountPath }}
  {{- if $r.gpu.enabled }}
  - name: dshm
    mountPath: /dev/shm
  {{- end }}
volumes:
  - name: models
    {{- if $m.persistence }}
    persistentVolumeClaim:
      claimName: {{ include "baton.router.modelClaim" $root }}
    {{- else }}
    emptyDir: {}
    {{- end }}
  {{- if $r.gpu.enabled }}
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $r.gpu.shmSizeLimit }}
  {{- end }}
{{- end -}}
