{{- define "baton.rewardLogger.datasetClaim" -}}
{{- default (include "baton.componentName" (dict "root" . "component" "episodes")) .Values.rewardLogger.dataset.existingClaim -}}
{{- end -}}

{{/* Where the episode volume is mounted: config.reward_logger.dataset_dir, unless that is a URL (object storage needs no volume). */}}
{{- define "baton.rewardLogger.datasetMount" -}}
{{- $dir := .Values.config.reward_logger.dataset_dir | toString -}}
{{- if not (contains "://" $dir) }}{{ $dir }}{{ end -}}
{{- end -}}

{{/* The episode volume of the reward logger and (read-only) the trainer. Call with (dict "root" $ "readOnly" BOOL). */}}
{{- define "baton.rewardLogger.datasetVolume" -}}
- name: episodes
  {{- if .root.Values.rewardLogger.dataset.persistence }}
  persistentVolumeClaim:
    claimName: {{ include "baton.rewardLogger.datasetClaim" .root }}
    {{- if .readOnly }}
    readOnly: true
    {{- end }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end -}}

{{/* Where an evaluation set's file lies in the reward logger pod: as the code resolves it, relative to the configuration file's folder. */}}
{{- define "baton.rewardLogger.evalSetPath" -}}
{{- $path := toString .path -}}
{{- if isAbs $path -}}
{{- clean $path -}}
{{- else -}}
{{- clean (printf "%s/%s" (include "baton.configDir" .) $path) -}}
{{- end -}}
{{- end -}}

{{/* The reward logger's additions to the common pod: the episode volume and the evaluation sets. */}}
{{- define "baton.rewardLogger.pod" -}}
{{- $root := .root -}}
{{- $l := .w -}}
{{- $d := $l.dataset -}}
{{- $mount := include "baton.rewardLogger.datasetMount" $root -}}
{{- if and $mount $d.persistence (has "ReadWriteOnce" $d.accessModes) }}
# A ReadWriteOnce volume cannot be attached to the old and the new pod on different nodes.
strategy:
  type: Recreate
{{- end }}
volumeMounts:
  {{- if $mount }}
  - name: episodes
    mountPath: {{ $mount }}
  {{- end }}
  {{- if $l.evalSets.configMap }}
  - name: eval-sets
    mountPath: {{ $l.evalSets.mountPath }}
    readOnly: true
  {{- end }}
volumes:
  {{- if $mount }}
  {{- include "baton.rewardLogger.datasetVolume" (dict "root" $root "readOnly" false) | nindent 2 }}
  {{- end }}
  {{- if $l.evalSets.configMap }}
  - name: eval-sets
    configMap:
      name: {{ $l.evalSets.configMap }}
  {{- end }}
{{- end -}}
