//! The music app: library, liked songs and playlists.

use serde_json::{Value, json};

use super::super::world::{Playlist, World};
use super::{Args, Reply, paginate};

fn song_summary(world: &World, id: u32) -> Value {
    match world.music.songs.get(&id) {
        Some(s) => json!({"song_id": id, "title": s.title, "artist": s.artist, "genre": s.genre}),
        None => json!({"song_id": id}),
    }
}

fn listing(
    world: &World,
    ids: &[u32],
    page: usize,
    size: usize,
    multi_page: &mut bool,
) -> Vec<Value> {
    let all: Vec<Value> = ids.iter().map(|id| song_summary(world, *id)).collect();
    let (items, multi) = paginate(&all, page, size);
    *multi_page = multi;
    items
}

fn song_id(world: &World, args: &Args<'_>) -> Result<u32, String> {
    args.id("song_id")
        .filter(|id| world.music.songs.contains_key(id))
        .ok_or_else(|| format!("No song with id {}.", args.int("song_id").unwrap_or(-1)))
}

fn playlist_id(world: &World, args: &Args<'_>) -> Result<u32, String> {
    args.id("playlist_id")
        .filter(|id| world.music.playlists.contains_key(id))
        .ok_or_else(|| {
            format!(
                "No playlist with id {}.",
                args.int("playlist_id").unwrap_or(-1)
            )
        })
}

pub(super) fn call(
    world: &mut World,
    api: &str,
    args: &Args<'_>,
    paging: Option<(usize, usize)>,
    multi_page: &mut bool,
) -> Reply {
    let (page, size) = paging.unwrap_or((1, super::DEFAULT_PAGE_SIZE));
    match api {
        "list_library" => {
            let ids = world.music.library.clone();
            let songs = listing(world, &ids, page, size, multi_page);
            Ok(json!({"page": page, "page_size": size, "songs": songs}))
        }
        "list_liked_songs" => {
            let ids = world.music.liked.clone();
            let songs = listing(world, &ids, page, size, multi_page);
            Ok(json!({"page": page, "page_size": size, "songs": songs}))
        }
        "list_playlists" => {
            let all: Vec<Value> = world
                .music
                .playlists
                .iter()
                .map(|(id, p)| json!({"playlist_id": id, "name": p.name, "song_count": p.song_ids.len()}))
                .collect();
            let (items, multi) = paginate(&all, page, size);
            *multi_page = multi;
            Ok(json!({"page": page, "page_size": size, "playlists": items}))
        }
        "show_playlist" => {
            let id = playlist_id(world, args)?;
            let playlist = &world.music.playlists[&id];
            let ids = playlist.song_ids.clone();
            let name = playlist.name.clone();
            let songs = listing(world, &ids, page, size, multi_page);
            Ok(
                json!({"playlist_id": id, "name": name, "page": page, "page_size": size, "songs": songs}),
            )
        }
        "show_song" => {
            let id = song_id(world, args)?;
            let s = &world.music.songs[&id];
            Ok(json!({
                "song_id": id,
                "title": s.title,
                "artist": s.artist,
                "genre": s.genre,
                "duration_seconds": s.duration_s,
                "released": s.released,
                "liked": world.music.liked.contains(&id),
                "in_library": world.music.library.contains(&id),
            }))
        }
        "create_playlist" => {
            let name = args.str("name").trim().to_string();
            if name.is_empty() {
                return Err("`name` must not be empty.".into());
            }
            if name.chars().count() > 100 {
                return Err("`name` must have at most 100 characters.".into());
            }
            if world
                .music
                .playlists
                .values()
                .any(|p| p.name.eq_ignore_ascii_case(&name))
            {
                return Err(format!("A playlist named `{name}` already exists."));
            }
            let id = world
                .music
                .playlists
                .keys()
                .next_back()
                .map_or(1, |k| k + 1);
            world.music.playlists.insert(
                id,
                Playlist {
                    name,
                    song_ids: Vec::new(),
                },
            );
            Ok(json!({"playlist_id": id, "message": "Playlist created."}))
        }
        "add_song_to_playlist" => {
            let pid = playlist_id(world, args)?;
            let sid = song_id(world, args)?;
            let playlist = world
                .music
                .playlists
                .get_mut(&pid)
                .ok_or("No such playlist.")?;
            if playlist.song_ids.contains(&sid) {
                return Err(format!("Song {sid} is already in playlist {pid}."));
            }
            playlist.song_ids.push(sid);
            Ok(json!({"message": format!("Added song {sid} to playlist {pid}.")}))
        }
        "remove_song_from_playlist" => {
            let pid = playlist_id(world, args)?;
            let sid = song_id(world, args)?;
            let playlist = world
                .music
                .playlists
                .get_mut(&pid)
                .ok_or("No such playlist.")?;
            let before = playlist.song_ids.len();
            playlist.song_ids.retain(|s| *s != sid);
            if playlist.song_ids.len() == before {
                return Err(format!("Song {sid} is not in playlist {pid}."));
            }
            Ok(json!({"message": format!("Removed song {sid} from playlist {pid}.")}))
        }
        "like_song" => {
            let sid = song_id(world, args)?;
            if world.music.liked.contains(&sid) {
                return Err(format!("Song {sid} is already liked."));
            }
            world.music.liked.insert(0, sid);
            Ok(json!({"message": format!("Liked song {sid}.")}))
        }
        "unlike_song" => {
            let sid = song_id(world, args)?;
            let before = world.music.liked.len();
            world.music.liked.retain(|s| *s != sid);
            if world.music.liked.len() == before {
                return Err(format!("Song {sid} is not liked."));
            }
            Ok(json!({"message": format!("Unliked song {sid}.")}))
        }
        _ => Err(format!("The app `music` has no API `{api}`.")),
    }
}
