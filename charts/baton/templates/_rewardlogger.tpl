{{- define "baton.rewardLogger.datasetClaim" -}}
{{- default (include "baton.componentName" (dict "root" . "component" "episodes")) .Values.rewardLogger.dataset.existingClaim -}}
{{- end -}}
