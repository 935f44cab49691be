// SPDX-License-Identifier: MIT
// Schema check of Kubernetes objects offline: each object of the JSON array on stdin is validated
// by the kubernetes-models package (JSON schemas generated from Kubernetes' OpenAPI spec: types,
// required fields, enums, formats; fields a schema does not know are not reported). Prints one
// line per object; exit 0 all valid, 1 any invalid or of a kind it has no schema for.
// usage: node validate-schema.js < objects.json   (NODE_PATH: where kubernetes-models is)
"use strict";
const docs = JSON.parse(require("fs").readFileSync(0, "utf8"));
let bad = 0;
for (const o of docs) {
  const what = `${o.kind}/${(o.metadata || {}).name} (${o.apiVersion})`;
  let K;
  try {
    K = require("kubernetes-models/" + o.apiVersion)[o.kind];
  } catch (e) {
    K = undefined;
  }
  if (!K) {
    console.log(`NO SCHEMA ${what}`);
    bad++;
    continue;
  }
  try {
    new K(o).validate();
    console.log(`valid ${what}`);
  } catch (e) {
    console.log(`INVALID ${what}: ${e.message}`);
    bad++;
  }
}
process.exit(bad ? 1 : 0);
