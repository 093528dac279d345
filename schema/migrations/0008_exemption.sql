-- 0008: exemption is the id of the exemption (rules file, exemptions:) that let a check past
-- one or more of its rules, '' for none (every row before this migration), so that exempt
-- usage stays visible and can be told apart. Added and, on a cluster, the Distributed table
-- made again as in 0007 (18.16 has no ADD COLUMN IF NOT EXISTS: the runner takes a column that
-- exists for added).
{{- $ine := ""}}{{if .Modern}}{{$ine = "IF NOT EXISTS "}}{{end}}
ALTER TABLE {{local "decisions"}}{{.OnCluster}} ADD COLUMN {{$ine}}exemption String DEFAULT '';
{{- if .OnCluster}}
DROP TABLE IF EXISTS {{.DB}}.decisions{{.OnCluster}};
{{distributed "decisions"}}
{{- end}}
