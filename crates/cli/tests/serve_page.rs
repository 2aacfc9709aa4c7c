//! The chat page at `/`, driven in headless Chromium (tests/server/test_page.py): an answer
//! streams in, Stop ends it, and a server error shows on the page.

mod common;

use common::server::{run_python, Server};

#[test]
fn the_chat_page_streams_an_answer_stops_and_shows_errors() {
    let server = Server::start(&["-np", "2", "-c", "512"]);
    run_python("test_page.py", &["--base-url", &server.base]);
}
