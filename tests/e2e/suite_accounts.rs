//! The users and groups the tests make are removed when the last test process using
//! them exits, and only those (issue 37, item 3; `tests/support/users.rs`): a test
//! process (this executable, run again) makes a set of accounts next to a group and a
//! user that existed before, and exits.

use std::process::Command;

use gpushare_tests::users::{Accounts, ensure, exists, members, record_of, release};
use gpushare_tests::{is_root, text};

/// Set, for the run of this executable that [`child_makes_the_accounts`] makes: the
/// accounts' name stem.
const CHILD_ENV: &str = "GPUSHARE_E2E_ACCOUNTS_CHILD";

/// Accounts named after `stem` (up to 32 characters each): a group made, a user made in
/// it and in the group that existed before, and the user that existed before added to
/// both groups.
fn accounts(stem: &str) -> Accounts {
    let (made_group, made_user) = (format!("{stem}-g"), format!("{stem}-u"));
    let (old_group, old_user) = (format!("{stem}-og"), format!("{stem}-ou"));
    Accounts {
        set: stem.to_string(),
        groups: vec![old_group.clone(), made_group.clone()],
        users: vec![
            (made_user, vec![made_group.clone(), old_group.clone()]),
            (old_user, vec![made_group, old_group]),
        ],
    }
}

/// The set's accounts, when run by [`the_accounts_a_test_process_made_are_gone_after_it`]:
/// passes at once otherwise (it is not a test by itself).
#[test]
fn child_makes_the_accounts() {
    if let Some(stem) = std::env::var_os(CHILD_ENV) {
        let accounts = accounts(stem.to_str().unwrap());
        ensure(&accounts);
        for (user, _) in &accounts.users {
            assert!(exists("passwd", user), "{user} was made");
        }
    }
}

/// Removes what the test made itself, whatever happened.
struct Before(Vec<(&'static str, String)>);

impl Drop for Before {
    fn drop(&mut self) {
        for (command, name) in &self.0 {
            let _ = Command::new(command).arg(name).output();
        }
    }
}

#[test]
fn the_accounts_a_test_process_made_are_gone_after_it_and_nothing_else() {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users");
        return;
    }
    let stem = format!("gpushare-e2e-t{}", std::process::id());
    let (made_group, made_user) = (format!("{stem}-g"), format!("{stem}-u"));
    let (old_group, old_user) = (format!("{stem}-og"), format!("{stem}-ou"));
    // A group and a user that existed before (as a package's `gpushare` group may).
    let _before = Before(vec![("userdel", old_user.clone()), ("groupdel", old_group.clone())]);
    let made = |cmd: &mut Command| assert!(cmd.output().unwrap().status.success(), "{cmd:?}");
    made(Command::new("groupadd").args(["--system", &old_group]));
    made(Command::new("useradd").args(["--system", "--no-create-home", &old_user]));
    let run_child = || {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "suite_accounts::child_makes_the_accounts"])
            .env(CHILD_ENV, &stem)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{}", text(&out));
    };

    // One process: everything it made is gone when it has exited; what was there stays,
    // without the memberships it added.
    run_child();
    assert!(!exists("passwd", &made_user), "{made_user} is left behind");
    assert!(!exists("group", &made_user), "{made_user}'s own group is left behind");
    assert!(!exists("group", &made_group), "{made_group} is left behind");
    assert!(exists("passwd", &old_user) && exists("group", &old_group), "removed what it found");
    assert_eq!(members(&old_group), Vec::<String>::new(), "memberships it added are kept");
    assert!(!record_of(&stem).exists(), "its record is left behind");

    // Two processes: the accounts stay while one still uses them, and go with the last.
    ensure(&accounts(&stem));
    run_child();
    assert!(exists("passwd", &made_user) && exists("group", &made_group), "removed in use");
    assert_eq!(members(&old_group), [made_user.clone(), old_user.clone()]);
    release(&stem);
    assert!(!exists("passwd", &made_user) && !exists("group", &made_group));
    assert!(exists("passwd", &old_user) && members(&old_group).is_empty());
}
