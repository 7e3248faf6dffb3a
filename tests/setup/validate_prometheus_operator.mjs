// Validates Prometheus Operator objects (PodMonitor, ServiceMonitor, PrometheusRule, ...) and Grafana
// Operator objects (GrafanaDashboard) with the schemas of @kubernetes-models/prometheus-operator and
// @kubernetes-models/grafana-operator (generated from the operators' CRDs).
//   node validate_prometheus_operator.mjs < objects.json      (a JSON list)
// Prints one line per object; exits 1 if any is invalid. NODE_PATH is not used by ES modules:
// run it with the package's node_modules resolvable (tests/test_deploy.py copies it next to them).
import { readFileSync } from "node:fs";

const docs = JSON.parse(readFileSync(0, "utf8"));
let bad = 0;
for (const d of docs) {
  const [group, version] = d.apiVersion.split("/");
  const pkg = group === "grafana.integreatly.org" ? "grafana-operator" : "prometheus-operator";
  const mod = await import(`@kubernetes-models/${pkg}/${group}/${version}/${d.kind}`);
  try {
    new mod[d.kind](d).validate();
    console.log(`ok ${d.kind}/${d.metadata.name}`);
  } catch (e) {
    bad++;
    console.log(`INVALID ${d.kind}/${d.metadata.name}: ${e.message}`);
  }
}
process.exit(bad ? 1 : 0);
