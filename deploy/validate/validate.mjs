// Validates Kubernetes manifests (YAML on stdin, several documents) against the Kubernetes
// schemas of kubernetes-models and KEDA's CRD models (@kubernetes-models/keda): every object
// must be of a known apiVersion/kind and pass its schema. Prints one line per object and exits
// non-zero naming the first object that fails.
//
//   kubectl kustomize deploy/overlays/cpu-dev | node deploy/validate/validate.mjs
import { readFileSync } from "node:fs";
import yaml from "js-yaml";

// "apps/v1" -> "kubernetes-models/apps/v1", "v1" -> "kubernetes-models/v1", KEDA's own package.
function modulePath(apiVersion) {
  if (apiVersion.startsWith("keda.sh/")) return `@kubernetes-models/keda/${apiVersion}`;
  return `kubernetes-models/${apiVersion}`;
}

const documents = yaml.loadAll(readFileSync(0, "utf8")).filter((d) => d != null);
if (documents.length === 0) {
  console.error("no objects on stdin");
  process.exit(1);
}
let failed = 0;
for (const object of documents) {
  const name = `${object.apiVersion}/${object.kind} ${object.metadata?.name ?? "(no name)"}`;
  let models;
  try {
    models = await import(modulePath(object.apiVersion));
  } catch (error) {
    console.error(`${name}: no schema for apiVersion ${object.apiVersion}`);
    failed++;
    continue;
  }
  const Model = models[object.kind];
  if (Model === undefined) {
    console.error(`${name}: no schema for kind ${object.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    console.error(`${name}: ${error.message ?? error}`);
    failed++;
  }
}
if (failed > 0) {
  console.error(`${failed} of ${documents.length} objects failed validation`);
  process.exit(1);
}
console.log(`${documents.length} objects valid`);
