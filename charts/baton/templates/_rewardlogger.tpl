{{- define "baton.rewardLogger.datasetClaim" -}}
{{- default (include "baton.componentName" (dict "root" . "component" "episodes")) .Values.rewardLogger.dataset.existingClaim -}}
{{- end -}}

{{/* Where an evaluation set's file lies in the reward logger pod. Call with (dict "root" . "set" $set). */}}
{{- define "baton.rewardLogger.evalSetPath" -}}
{{- if isAbs .set.path -}}
{{- clean .set.path -}}
{{- else -}}
{{- clean (printf "%s/%s" .root.Values.rewardLogger.evalSets.mountPath .set.path) -}}
{{- end -}}
{{- end -}}
