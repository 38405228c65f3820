//! `org.freedesktop.DBus.Introspectable` for the agent's objects: the XML rendered from the
//! interface tables of [`super::calls`] (so it says exactly what the door answers), the
//! fixed parts once, the dynamic part (which jobs exist) per call from a short list.

use std::fmt::Write;
use std::sync::OnceLock;

use gpushare_proto::OBJECT_PATH;

use super::calls::{AGENT1_INTERFACE, Interface, JOB1_INTERFACE, Object};

const HEADER: &str = "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n";

/// The standard interfaces every object of the agent answers.
const STANDARD: &str = r#"  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping">
    </method>
    <method name="GetMachineId">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect">
      <arg type="s" direction="out"/>
    </method>
  </interface>
  <interface name="org.freedesktop.DBus.Properties">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg type="v" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg type="a{sv}" direction="out"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{sv}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>
"#;

/// The XML of one of the agent's interfaces.
fn interface(i: &Interface) -> String {
    let mut x = String::new();
    let _ = writeln!(x, "  <interface name=\"{}\">", i.name);
    for m in i.methods {
        let _ = writeln!(x, "    <method name=\"{}\">", m.name);
        for (name, sig) in m.args {
            let _ = writeln!(x, "      <arg name=\"{name}\" type=\"{sig}\" direction=\"in\"/>");
        }
        if !m.reply.is_empty() {
            let _ = writeln!(x, "      <arg type=\"{}\" direction=\"out\"/>", m.reply);
        }
        let _ = writeln!(x, "    </method>");
    }
    for s in i.signals {
        let _ = writeln!(x, "    <signal name=\"{}\">", s.name);
        for (name, sig) in s.args {
            let _ = writeln!(x, "      <arg name=\"{name}\" type=\"{sig}\"/>");
        }
        let _ = writeln!(x, "    </signal>");
    }
    for p in i.properties {
        let (name, sig) = (p.name, p.signature);
        if p.changes {
            let _ = writeln!(x, "    <property name=\"{name}\" type=\"{sig}\" access=\"read\"/>");
        } else {
            let _ = writeln!(x, "    <property name=\"{name}\" type=\"{sig}\" access=\"read\">");
            let _ = writeln!(
                x,
                "      <annotation name=\"org.freedesktop.DBus.Property.EmitsChangedSignal\" value=\"const\"/>"
            );
            let _ = writeln!(x, "    </property>");
        }
    }
    let _ = writeln!(x, "  </interface>");
    x
}

fn node(interfaces: &str, children: &[String]) -> String {
    let mut x = String::from(HEADER);
    x.push_str("<node>\n");
    x.push_str(STANDARD);
    x.push_str(interfaces);
    for child in children {
        let _ = writeln!(x, "  <node name=\"{child}\"/>");
    }
    x.push_str("</node>\n");
    x
}

/// The introspection data of `object`, given the jobs that exist (numbers); `None` for a
/// job that does not.
pub fn xml(object: Object, jobs: &[u64]) -> Option<String> {
    static AGENT: OnceLock<String> = OnceLock::new();
    static JOB: OnceLock<String> = OnceLock::new();
    let above: Vec<&str> = OBJECT_PATH.split('/').filter(|s| !s.is_empty()).collect();
    Some(match object {
        Object::Above(depth) => node("", &[above[depth].to_string()]),
        Object::Agent => {
            let agent = AGENT.get_or_init(|| interface(&AGENT1_INTERFACE));
            let children = if jobs.is_empty() { vec![] } else { vec!["jobs".to_string()] };
            node(agent, &children)
        }
        Object::Jobs => node("", &jobs.iter().map(ToString::to_string).collect::<Vec<_>>()),
        Object::Job(n) if jobs.contains(&n) => {
            node(JOB.get_or_init(|| interface(&JOB1_INTERFACE)), &[])
        }
        Object::Job(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_object_lists_its_interfaces_and_children() {
        let root = xml(Object::Above(0), &[]).unwrap();
        assert!(root.contains("<node name=\"io\"/>"), "{root}");
        let gpushare = xml(Object::Above(2), &[]).unwrap();
        assert!(gpushare.contains("<node name=\"Agent1\"/>"));
        let agent = xml(Object::Agent, &[3]).unwrap();
        assert!(agent.contains("<interface name=\"io.gpushare.Agent1\">"));
        assert!(agent.contains("<method name=\"ValidateProfile\">"));
        assert!(agent.contains("<arg name=\"options\" type=\"a{sv}\" direction=\"in\"/>"));
        assert!(agent.contains("<property name=\"Version\" type=\"s\" access=\"read\">"));
        assert!(agent.contains("EmitsChangedSignal\" value=\"const\""));
        assert!(agent.contains("<node name=\"jobs\"/>"));
        assert!(!xml(Object::Agent, &[]).unwrap().contains("<node name=\"jobs\"/>"));
        let jobs = xml(Object::Jobs, &[3, 4]).unwrap();
        assert!(jobs.contains("<node name=\"3\"/>") && jobs.contains("<node name=\"4\"/>"));
        let job = xml(Object::Job(4), &[3, 4]).unwrap();
        assert!(job.contains("<signal name=\"Finished\">"));
        assert!(xml(Object::Job(5), &[3, 4]).is_none());
    }
}
