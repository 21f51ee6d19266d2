//! A TCP proxy in front of the test RabbitMQ that a test can break: cut
//! (a dead uplink), stall (a black-holed link), hold the broker's replies,
//! or inject frames between the broker's.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, watch};

use super::amqp::BROKER;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Reset every connection and refuse new ones, like a dead uplink.
    Down,
    /// Keep connections open but forward nothing, like a black-holed link.
    Stall,
    /// Forward what the client sends; hold what the broker sends (its
    /// confirms) until the mode is `Pass` again.
    HoldReplies,
}

pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    inject: broadcast::Sender<Vec<u8>>,
}

impl Proxy {
    pub async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, _) = watch::channel(Mode::Pass);
        let (inject, _) = broadcast::channel(16);
        let (m, i) = (mode.clone(), inject.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *m.borrow() == Mode::Down {
                    continue; // dropped: the client sees the connection reset
                }
                let Ok(server) = TcpStream::connect(BROKER).await else {
                    continue;
                };
                tokio::spawn(proxy_connection(
                    client,
                    server,
                    m.subscribe(),
                    i.subscribe(),
                ));
            }
        });
        Proxy { addr, mode, inject }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/%2f", self.addr)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Sends a frame to the client of every open connection, between two
    /// of the broker's frames.
    pub fn inject(&self, frame: Vec<u8>) {
        self.inject
            .send(frame)
            .expect("a proxied connection is open");
    }
}

/// Whether a connection must end on this mode change: always when the
/// link goes down; when it comes back after a stall (its bytes are lost).
fn ends(mode: Mode, stalled: &mut bool) -> bool {
    match mode {
        Mode::Down => true,
        Mode::HoldReplies => false,
        Mode::Stall => {
            *stalled = true;
            false
        }
        Mode::Pass => *stalled,
    }
}

async fn proxy_connection(
    client: TcpStream,
    server: TcpStream,
    mut mode: watch::Receiver<Mode>,
    mut inject: broadcast::Receiver<Vec<u8>>,
) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    // Whole frames from the broker, so that injected frames land between
    // two of them; read_exact is not cancel safe, hence its own task.
    let (frames_tx, mut frames) = mpsc::channel::<Vec<u8>>(64);
    let reader = tokio::spawn(async move {
        loop {
            let mut head = [0u8; 7];
            if server_rd.read_exact(&mut head).await.is_err() {
                return;
            }
            let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
            let mut frame = head.to_vec();
            frame.resize(7 + size + 1, 0);
            if server_rd.read_exact(&mut frame[7..]).await.is_err()
                || frames_tx.send(frame).await.is_err()
            {
                return;
            }
        }
    });
    let mut stalled = *mode.borrow() == Mode::Stall;
    let mut holding = *mode.borrow() == Mode::HoldReplies;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Cancel safety: `read` into a buffer, `recv` on channels and
        // `changed` are all cancel safe; writes happen in the arm bodies.
        tokio::select! {
            n = client_rd.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !stalled && server_wr.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            },
            frame = frames.recv() => match frame {
                None => break,
                Some(frame) if holding => held.push(frame),
                Some(frame) => {
                    if !stalled && client_wr.write_all(&frame).await.is_err() {
                        break;
                    }
                }
            },
            frame = inject.recv() => {
                if let Ok(frame) = frame {
                    if client_wr.write_all(&frame).await.is_err() {
                        break;
                    }
                }
            }
            changed = mode.changed() => {
                let now = *mode.borrow_and_update();
                if changed.is_err() || ends(now, &mut stalled) {
                    break;
                }
                holding = now == Mode::HoldReplies;
                if !holding {
                    let mut gone = false;
                    for frame in held.drain(..) {
                        gone = gone || client_wr.write_all(&frame).await.is_err();
                    }
                    if gone {
                        break;
                    }
                }
            }
        }
    }
    reader.abort();
}
