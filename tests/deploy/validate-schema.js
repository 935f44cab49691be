// SPDX-License-Identifier: MIT
// Schema check of Kubernetes objects offline: each object of the JSON array on stdin is validated
// by the kubernetes-models package (JSON schemas generated from Kubernetes' OpenAPI spec: types,
// required fields, enums, formats; fields a schema does not know are not reported). Prints one
// line per object; exit 0 all valid, 1 any invalid or of a kind it has no schema for.
// usage: node validate-schema.js < objects.json   (NODE_PATH: the node_modules folder kubernetes-models is in)
// kubernetes-models 5 is an ES module (import only, which does not read NODE_PATH), 4 CommonJS: each group's
// module is imported from its file, which works for both.
"use strict";
const path = require("path");
const { pathToFileURL } = require("url");

async function main() {
  const docs = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const dirs = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean);
  let bad = 0;
  for (const o of docs) {
    const what = `${o.kind}/${(o.metadata || {}).name} (${o.apiVersion})`;
    let K;
    for (const d of dirs) {
      try {
        const m = await import(pathToFileURL(path.join(d, "kubernetes-models", o.apiVersion, "index.js")).href);
        K = m[o.kind] || (m.default || {})[o.kind];
        if (K) break;
      } catch (e) {
        K = undefined;
      }
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
}

main();
