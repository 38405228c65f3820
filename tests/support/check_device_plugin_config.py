"""Checks a config file of NVIDIA's k8s-device-plugin v0.20.0 (api/config/v1, YAML or JSON).

Usage: check_device_plugin_config.py SCHEMA CONFIG

The schema (tests/data/device-plugin-config-schema.json, JSON Schema draft 7) says the
plugin's types and refusals; this script adds what a schema cannot say about a YAML file:
- one YAML document (the plugin reads the first and ignores the rest),
- no key twice in a mapping (sigs.k8s.io/yaml, which the plugin uses, keeps one of them in
  an undefined order: vendor/sigs.k8s.io/yaml/yaml.go:50 at v0.20.0),
- replicas written as whole numbers (Go's encoding/json refuses 4.0 for an int, where
  JSON Schema's "integer" takes it),
- each resource named once per sharing block (the plugin replicates a name's devices once
  per entry, internal/rm/device_map.go:303-344, with the same device ids).

Exit status: 0 valid (the document, as JSON, on stdout); 10 invalid (one problem a line,
"<path in the document>: <message>", worded by whichever jsonschema ran); 3 no jsonschema
or no yaml module; anything else is this script's own failure.
"""

import json
import sys

try:
    import jsonschema
    import yaml
except ImportError:
    sys.exit(3)


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping."""


def construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, "key %r written twice" % (key,), key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping
)


def invalid(problems):
    print("\n".join(problems))
    sys.exit(10)


def main():
    schema_path, config_path = sys.argv[1], sys.argv[2]
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    with open(config_path, "rb") as f:
        text = f.read()
    try:
        documents = list(yaml.load_all(text, Loader=UniqueKeyLoader))
    except yaml.YAMLError as e:
        invalid(["/: not YAML: %s" % str(e).replace("\n", " ")])
    if len(documents) != 1:
        invalid(["/: %d YAML documents, the plugin reads one" % len(documents)])
    config = documents[0]

    problems = []
    for e in jsonschema.Draft7Validator(schema).iter_errors(config):
        problems.append("/%s: %s" % ("/".join(map(str, e.absolute_path)), e.message))
    sharing = config.get("sharing") if isinstance(config, dict) else None
    blocks = sharing.items() if isinstance(sharing, dict) else []
    for kind, block in blocks:
        resources = block.get("resources") if isinstance(block, dict) else None
        if not isinstance(resources, list):
            continue
        names = []
        for i, resource in enumerate(resources):
            if not isinstance(resource, dict):
                continue
            at = "/sharing/%s/resources/%d" % (kind, i)
            replicas = resource.get("replicas")
            if isinstance(replicas, float):
                problems.append("%s/replicas: %r is not a whole number" % (at, replicas))
            name = resource.get("name")
            if name in names:
                problems.append("%s/name: %r named twice" % (at, name))
            names.append(name)
    if problems:
        invalid(sorted(problems))
    print(json.dumps(config, sort_keys=True))


main()
